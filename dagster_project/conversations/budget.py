"""The prompt token budget, counted with the real tokenizer and chat template, exactly and cheaply.

A byte-level BPE token covers at least one byte of the (NFC-normalized) text, so a rendered prompt has
at most as many tokens as bytes. That bound is the template's scaffolding for the same sequence of
roles (rendered once per role sequence, with empty contents) plus the contents' bytes; the template
only trims contents. Only prompts whose bound exceeds the budget are rendered and tokenized, which is
a handful in a normal dataset: the decision is exact, the cost is that of a byte count.
"""

from __future__ import annotations

import functools
import unicodedata
from typing import Any

from dagster_project.tokenizer import render_prompt_ids, render_text

_ROLE_SEQUENCES_CACHED = 4096


class PromptBudget:
    def __init__(self, tokenizer: Any, max_tokens: int, *, enable_thinking: bool, preserve_thinking: bool):
        if max_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {max_tokens}")
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.flags = {"enable_thinking": enable_thinking, "preserve_thinking": preserve_thinking}
        self.exact_counts = 0  # prompts that needed the tokenizer
        self._scaffold_bytes = functools.lru_cache(maxsize=_ROLE_SEQUENCES_CACHED)(self._render_scaffold)

    def tokens_over(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int | None:
        """The prompt's token count when it exceeds the budget, else None.

        Tools, tool calls and reasoning are laid out by the template in ways a byte bound does not follow
        cheaply, so prompts holding any of them are always rendered."""
        structured = tools or any(m.get("tool_calls") or m.get("reasoning_content") for m in messages)
        if not structured:
            contents = sum(len(unicodedata.normalize("NFC", m["content"]).encode("utf-8")) for m in messages)
            if contents + self._scaffold_bytes(tuple(m["role"] for m in messages)) <= self.max_tokens:
                return None
        self.exact_counts += 1
        tokens = len(render_prompt_ids(self.tokenizer, messages, tools=tools, **self.flags))
        return tokens if tokens > self.max_tokens else None

    def _render_scaffold(self, roles: tuple[str, ...]) -> int:
        empty = [{"role": role, "content": ""} for role in roles]
        return len(render_text(self.tokenizer, empty, add_generation_prompt=True, **self.flags).encode("utf-8"))
