"""The prompt token budget, counted with the real tokenizer and chat template, exactly and cheaply.

A byte-level BPE token covers at least one byte of the (NFC-normalized) text, so a rendered prompt has
at most as many tokens as bytes. That bound is the template's scaffolding plus the contents' bytes (the
template only trims contents). Only prompts whose bound exceeds the budget are rendered and tokenized, which
is a handful in a normal dataset: the decision is exact, the cost is that of a byte count.

The tokenizer is loaded on the first prompt that needs it, so a dataset that has none never pays the seconds
of loading it. Until then the scaffolding of a prompt of plain messages is bounded without rendering it: at
most `SCAFFOLD_BYTES_PER_MESSAGE` per message plus `SCAFFOLD_BYTES_FIXED` (the generation prompt and its think
block), which the Qwen3.6 template never exceeds (`tests/unit/conversations/test_budget_and_dedup.py` checks
every role sequence); once it is loaded, the scaffolding of each role sequence is rendered once, a tighter bound.

A prompt is never tokenized whole when it is far too long: no token covers more bytes than the vocabulary's
longest token, so the rendered prompt's bytes divided by that length is a lower bound of its tokens. A prompt whose
lower bound exceeds the budget is refused on it (`Overrun.counted` False); only the others are tokenized, and
those hold at most budget × longest-token bytes. A 30 MB prompt (the ingest's rows stop at `max_line_bytes`) costs
a rendering of its text, not a tokenization (gigabytes for millions of tokens).
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable
from typing import Any, NamedTuple

from dagster_project.tokenizer import render_prompt_ids, render_text

SCAFFOLD_BYTES_PER_MESSAGE = 52
SCAFFOLD_BYTES_FIXED = 48
_ROLE_SEQUENCES_CACHED = 4096


class Overrun(NamedTuple):
    """A prompt over the budget: its token count, or a lower bound of it when the prompt was too long to count."""

    tokens: int
    counted: bool = True

    def __str__(self) -> str:
        return f"{self.tokens}" if self.counted else f"at least {self.tokens}"


class PromptBudget:
    def __init__(
        self, load_tokenizer: Callable[[], Any], max_tokens: int, *, enable_thinking: bool, preserve_thinking: bool
    ):
        if max_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {max_tokens}")
        self.load_tokenizer = load_tokenizer
        self.tokenizer: Any = None  # loaded by the first prompt that needs it
        self.max_tokens = max_tokens
        self.flags = {"enable_thinking": enable_thinking, "preserve_thinking": preserve_thinking}
        self.exact_counts = 0  # prompts that needed the tokenizer
        self.longest_token_bytes = 0  # of the tokenizer's vocabulary, once it is loaded
        self._scaffold_bytes = functools.lru_cache(maxsize=_ROLE_SEQUENCES_CACHED)(self._render_scaffold)

    def tokens_over(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Overrun | None:
        """The prompt's token count (or a lower bound of it, for a prompt far too long) when it exceeds the budget,
        else None (prompts with tools, tool calls or reasoning are always rendered: `_structured`)."""
        if not _structured(messages, tools) and self._bytes_bound(messages) <= self.max_tokens:
            return None
        self.exact_counts += 1
        if self.tokenizer is None:
            self.tokenizer = self.load_tokenizer()
            self.longest_token_bytes = max(len(token.encode("utf-8")) for token in self.tokenizer.get_vocab())
        text = render_text(self.tokenizer, messages, add_generation_prompt=True, tools=tools, **self.flags)
        at_least = _nfc_bytes(text) // self.longest_token_bytes
        del text  # the tokenization below needs its own copies, not this one
        if at_least > self.max_tokens:
            return Overrun(at_least, counted=False)
        tokens = len(render_prompt_ids(self.tokenizer, messages, tools=tools, **self.flags))
        return Overrun(tokens) if tokens > self.max_tokens else None

    def _bytes_bound(self, messages: list[dict[str, Any]]) -> int:
        if self.tokenizer is None:
            scaffold = _scaffold_bound(messages)
        else:
            scaffold = self._scaffold_bytes(tuple(m["role"] for m in messages))
        return scaffold + _content_bytes(messages)

    def _render_scaffold(self, roles: tuple[str, ...]) -> int:
        empty = [{"role": role, "content": ""} for role in roles]
        return len(render_text(self.tokenizer, empty, add_generation_prompt=True, **self.flags).encode("utf-8"))


def may_exceed(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, max_tokens: int) -> bool:
    """Whether `PromptBudget.tokens_over` may return a count for this prompt, decided without a tokenizer: when
    False it returns None, tokenizer loaded or not (the bound it uses once one is loaded is tighter)."""
    return _structured(messages, tools) or _scaffold_bound(messages) + _content_bytes(messages) > max_tokens


def _scaffold_bound(messages: list[dict[str, Any]]) -> int:
    """The template's bytes around the messages, bounded without a tokenizer to render them."""
    return SCAFFOLD_BYTES_FIXED + SCAFFOLD_BYTES_PER_MESSAGE * len(messages)


def _structured(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
    """Tools, tool calls and reasoning are laid out by the template in ways a byte bound does not follow
    cheaply, so prompts holding any of them are always rendered."""
    if tools:
        return True
    for message in messages:  # a loop, not any(): this runs for every row
        if len(message) > 2 and (message.get("tool_calls") or message.get("reasoning_content")):
            return True
    return False


def _content_bytes(messages: list[dict[str, Any]]) -> int:
    contents = 0
    for message in messages:
        contents += _nfc_bytes(message["content"])
    return contents


def _nfc_bytes(text: str) -> int:
    """The UTF-8 bytes of `text` as the tokenizer sees it (NFC-normalized)."""
    # ASCII text is NFC already and one byte per character: the common case costs no normalization.
    return len(text) if text.isascii() else len(unicodedata.normalize("NFC", text).encode())
