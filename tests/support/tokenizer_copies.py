"""Local copies of the built-in tokenizer's folder, edited the way an operator's `DFLASH_TOKENIZER` copy might be."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dagster_project.tokenizer import BUILTIN_TOKENIZER, builtin_tokenizer_dir, load_tokenizer

# An edit that changes what is rendered: every user turn opens with an instruction the template adds.
USER_TURNS_PREFIXED = ("'<|im_start|>user\\n' + content", "'<|im_start|>user\\nAnswer briefly. ' + content")


def tokenizer_copy(dest: Path, *, template_edit: tuple[str, str] | None = None, eos_token: str | None = None) -> Path:
    """A copy of the built-in tokenizer's folder at `dest`: its chat template with `template_edit` (old, new)
    applied, its end-of-sequence token replaced by `eos_token`; returns `dest` (a `DFLASH_TOKENIZER` value)."""
    load_tokenizer(BUILTIN_TOKENIZER)  # builds the folder on a fresh cache
    shutil.copytree(builtin_tokenizer_dir(), dest)
    if template_edit is not None:
        template = dest / "chat_template.jinja"
        text = template.read_text(encoding="utf-8")
        old, new = template_edit
        assert old in text, f"the template has no {old!r} to edit"
        template.write_text(text.replace(old, new), encoding="utf-8")
    if eos_token is not None:
        config_path = dest / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["eos_token"] = eos_token
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return dest
