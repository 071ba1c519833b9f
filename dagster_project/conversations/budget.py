"""The prompt token budget, counted with the real tokenizer and chat template, exactly and cheaply.

A byte-level BPE token covers at least one byte of the (NFC-normalized) text, so a rendered prompt has
at most as many tokens as bytes. That bound is the template's scaffolding plus the contents' bytes (the
template only trims contents). The scaffolding of a prompt of plain messages is bounded without rendering
it: at most `SCAFFOLD_BYTES_PER_MESSAGE` per message plus `SCAFFOLD_BYTES_FIXED` (the generation prompt and
its empty think block); the Qwen3.6 template adds under half of that (`tests/unit/conversations/test_budget.py`
checks every role sequence). Only prompts whose bound exceeds the budget are rendered and tokenized, which
is a handful in a normal dataset: the decision is exact, the cost is that of a byte count. The tokenizer is
loaded on the first such prompt, so a dataset that has none never pays the seconds of loading it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any

from dagster_project.tokenizer import render_prompt_ids

SCAFFOLD_BYTES_PER_MESSAGE = 128
SCAFFOLD_BYTES_FIXED = 128


class PromptBudget:
    def __init__(
        self, load_tokenizer: Callable[[], Any], max_tokens: int, *, enable_thinking: bool, preserve_thinking: bool
    ):
        if max_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {max_tokens}")
        self.load_tokenizer = load_tokenizer
        self.max_tokens = max_tokens
        self.flags = {"enable_thinking": enable_thinking, "preserve_thinking": preserve_thinking}
        self.exact_counts = 0  # prompts that needed the tokenizer

    def tokens_over(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int | None:
        """The prompt's token count when it exceeds the budget, else None.

        Tools, tool calls and reasoning are laid out by the template in ways a byte bound does not follow
        cheaply, so prompts holding any of them are always rendered."""
        structured = tools or any(m.get("tool_calls") or m.get("reasoning_content") for m in messages)
        if not structured and self._bytes_bound(messages) <= self.max_tokens:
            return None
        self.exact_counts += 1
        tokens = len(render_prompt_ids(self.load_tokenizer(), messages, tools=tools, **self.flags))
        return tokens if tokens > self.max_tokens else None

    def _bytes_bound(self, messages: list[dict[str, Any]]) -> int:
        scaffold = SCAFFOLD_BYTES_FIXED + SCAFFOLD_BYTES_PER_MESSAGE * len(messages)
        contents = 0
        for message in messages:
            content = message["content"]
            # ASCII text is NFC already and one byte per character: the common case costs no normalization.
            contents += len(content) if content.isascii() else len(unicodedata.normalize("NFC", content).encode())
        return scaffold + contents
