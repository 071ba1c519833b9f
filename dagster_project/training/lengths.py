"""What a trainer's sequence length costs: rows and supervised tokens beyond `max_length`, and row lengths.

Drafter trainers (SpecForge's Qwen3.6-27B recipe, NVIDIA Model-Optimizer's DFlash trainer, DeepSpec) train at
4,096 tokens and cut a longer row there without a word, while thinking-mode answers run to 32K. So every
training shard counts, over the rows no other reason excluded, how many are longer than `max_length` and how
many supervised tokens are lost past it — cut here (`truncate`), dropped with their row (`drop`), or cut by
the trainer later (`keep`, which only records) — and a histogram of row lengths (prompt + whole output).
A row whose prompt leaves fewer than 2 output tokens inside `max_length` loses all of its output under
`keep` and `truncate` alike (it is excluded, since the trainer would see no anchor in it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dagster_project.generation_settings import MIN_OUTPUT_TOKENS as MIN_OUTPUT_TOKENS  # one rule, its own module

if TYPE_CHECKING:  # readers of training manifests alone (`dflash status`) never load numpy
    import numpy as np

KEEP = "keep"
TRUNCATE = "truncate"
DROP = "drop"
LENGTH_POLICIES = (KEEP, TRUNCATE, DROP)
HISTOGRAM_EDGES = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def histogram_labels() -> list[str]:
    return [f"<={edge}" for edge in HISTOGRAM_EDGES] + [f">{HISTOGRAM_EDGES[-1]}"]


def length_histogram(lengths: np.ndarray) -> dict[str, int]:
    """Rows per length bucket (every bucket present, so histograms add up and plot on the same axis)."""
    import numpy as np

    buckets = np.searchsorted(np.asarray(HISTOGRAM_EDGES), np.asarray(lengths), side="left")
    counts = np.bincount(buckets, minlength=len(HISTOGRAM_EDGES) + 1)
    return {label: int(count) for label, count in zip(histogram_labels(), counts, strict=True)}


def kept_output(prompt_len: np.ndarray, output_len: np.ndarray, max_length: int | None) -> np.ndarray:
    """Output tokens of each row that fit in `max_length` after its whole prompt."""
    if max_length is None:
        return output_len
    import numpy as np

    return np.clip(max_length - prompt_len, 0, output_len)


@dataclass
class LengthFigures:
    """Rows judged against `max_length` (those no other reason excluded), and what the policy loses of them."""

    max_length: int | None = None
    policy: str = KEEP
    rows: int = 0
    rows_over: int = 0
    supervised_tokens: int = 0  # output tokens of the judged rows, before the policy
    supervised_tokens_beyond: int = 0  # of those, lost: past max_length, or in a dropped or prompt-filled row
    histogram: dict[str, int] = field(default_factory=lambda: dict.fromkeys(histogram_labels(), 0))

    @property
    def lost_share(self) -> float:
        return self.supervised_tokens_beyond / self.supervised_tokens if self.supervised_tokens else 0.0

    def add(self, prompt_len: np.ndarray, output_len: np.ndarray) -> None:
        import numpy as np

        prompt_len, output_len = np.asarray(prompt_len, np.int64), np.asarray(output_len, np.int64)
        lengths = prompt_len + output_len
        kept = kept_output(prompt_len, output_len, self.max_length)
        over = lengths > self.max_length if self.max_length is not None else np.zeros(lengths.size, bool)
        if self.max_length is None:
            lost = np.zeros(lengths.size, np.int64)
        elif self.policy == DROP:
            lost = np.where(over, output_len, 0)
        else:  # the rows `prompt_fills_max_length` excludes lose all of their output
            prompt_fills = prompt_len > self.max_length - MIN_OUTPUT_TOKENS
            lost = np.where(prompt_fills, output_len, output_len - kept)
        self.rows += int(lengths.size)
        self.rows_over += int(over.sum())
        self.supervised_tokens += int(output_len.sum())
        self.supervised_tokens_beyond += int(lost.sum())
        for label, count in length_histogram(lengths).items():
            self.histogram[label] = self.histogram.get(label, 0) + count

    def merge(self, other: LengthFigures) -> None:
        """Add another shard's figures (the dataset-wide figures are the sum of the shards')."""
        self.rows += other.rows
        self.rows_over += other.rows_over
        self.supervised_tokens += other.supervised_tokens
        self.supervised_tokens_beyond += other.supervised_tokens_beyond
        for label, count in other.histogram.items():
            self.histogram[label] = self.histogram.get(label, 0) + count


MAX_LOST_SUPERVISED_SHARE = 0.10


@dataclass(frozen=True)
class LengthGateOptions:
    """The threshold of the `length_loss` gate on training shards."""

    max_lost_supervised_share: float = field(
        default=MAX_LOST_SUPERVISED_SHARE,
        metadata={
            "help": "Largest share of a shard's supervised tokens that may be lost to max_length (cut here, dropped, "
            "or cut by the trainer under 'keep') before the shard is blocked."
        },
    )
