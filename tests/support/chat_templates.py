"""The official Qwen3.6 chat template from the shared fixtures, to check the project's renders against."""

from __future__ import annotations

import copy
from typing import Any

from transformers import PreTrainedTokenizerBase

from tests.support.paths import require_shared

OFFICIAL_TEMPLATE_NAME = "qwen3_6.official_reconstructed.jinja"


def official_template() -> str:
    """Its text; the test fails (skips under `make test-fast`) when ../shared is absent."""
    return require_shared("fixtures", "chat_templates", OFFICIAL_TEMPLATE_NAME).read_text(encoding="utf-8")


def official_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    template: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool = True,
) -> list[int]:
    """The ids of the generation prompt the official template renders for `messages` (and `tools`)."""
    text = tokenizer.apply_chat_template(
        copy.deepcopy(messages),
        tools=tools,
        chat_template=template,
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=enable_thinking,
    )
    return tokenizer.encode(text, add_special_tokens=False)
