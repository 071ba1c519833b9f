"""Speculative decoding settings (MTP: NEXTN, which SGLang resolves to EAGLE) as one value: steps, top-k, draft
tokens, or off.

SGLang 0.5.23 takes the three sizes together (`--speculative-num-steps`, `--speculative-eagle-topk`,
`--speculative-num-draft-tokens`: all three or none). With top-k 1 the draft is a chain and the server forces
the draft tokens to steps + 1; with top-k > 1 it is a tree of `steps` levels, `topk` candidates per node, of
which the best `draft tokens − 1` are verified. The model card's recipe for Qwen3.6-27B is 3/1/4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OFF = "off"


@dataclass(frozen=True)
class SpecSetting:
    """steps/topk/draft-tokens of MTP speculative decoding."""

    steps: int
    topk: int
    draft_tokens: int

    def __post_init__(self) -> None:
        if self.steps < 1 or self.topk < 1:
            raise ValueError(f"speculative steps and top-k must be >= 1, got {self.label}")
        if self.topk == 1 and self.draft_tokens != self.steps + 1:
            raise ValueError(
                f"speculative {self.label}: with top-k 1 SGLang forces the draft tokens to steps + 1 "
                f"({self.steps}/1/{self.steps + 1})"
            )
        if not 2 <= self.draft_tokens <= self.topk * self.steps + 1:
            raise ValueError(
                f"speculative {self.label}: draft tokens must be between 2 and top-k x steps + 1 "
                f"({self.topk * self.steps + 1})"
            )

    @property
    def label(self) -> str:
        return f"{self.steps}/{self.topk}/{self.draft_tokens}"

    @property
    def depth(self) -> int:
        """The most drafts one verify pass can accept: the tree's levels, or fewer when fewer nodes are verified."""
        return min(self.steps, self.draft_tokens - 1)

    @property
    def width(self) -> float:
        """Verified candidates per level, on average (1 for a chain)."""
        return max(1.0, min(float(self.topk), (self.draft_tokens - 1) / self.depth))

    @property
    def reserved_tokens(self) -> int:
        """Tokens the server adds to every prompt's length checks for the drafts: max(topk x steps, draft tokens)."""
        return max(self.topk * self.steps, self.draft_tokens)

    def launch_args(self) -> list[str]:
        """The `sglang.launch_server` flags (NEXTN: the MTP layer of the checkpoint itself)."""
        return [
            "--speculative-algorithm", "NEXTN",
            "--speculative-num-steps", str(self.steps),
            "--speculative-eagle-topk", str(self.topk),
            "--speculative-num-draft-tokens", str(self.draft_tokens),
        ]  # fmt: skip


RECIPE = SpecSetting(3, 1, 4)  # the Qwen3.6-27B model card's


def parse_setting(text: str) -> SpecSetting | None:
    """`off` (no speculative decoding) or `STEPS/TOPK/DRAFT_TOKENS`, e.g. `3/1/4`; a clear error otherwise."""
    text = text.strip()
    if text.lower() == OFF:
        return None
    parts = text.split("/")
    if len(parts) != 3 or not all(part.strip().isdigit() for part in parts):
        raise ValueError(f"speculative setting {text!r}: use {OFF!r} or STEPS/TOPK/DRAFT_TOKENS such as 3/1/4")
    return SpecSetting(*(int(part) for part in parts))


def parse_list(text: str) -> list[SpecSetting | None]:
    """Comma-separated settings (`off,2/1/3`), each at most once; empty: none."""
    settings: list[SpecSetting | None] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        setting = parse_setting(item)
        if setting in settings:
            raise ValueError(f"speculative setting {item!r} is listed twice")
        settings.append(setting)
    return settings


def label(setting: SpecSetting | None) -> str:
    return setting.label if setting is not None else OFF


def of_server_info(info: dict[str, Any] | None) -> SpecSetting | None | str:
    """What a running server decodes with, from its `/server_info`; the text `unknown` when it does not say."""
    if not info:
        return "unknown"
    if info.get("speculative_algorithm") is None:
        return None
    try:
        return SpecSetting(
            int(info["speculative_num_steps"]),
            int(info["speculative_eagle_topk"]),
            int(info["speculative_num_draft_tokens"]),
        )
    except (KeyError, TypeError, ValueError):
        return "unknown"
