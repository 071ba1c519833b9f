"""Per-row structure of generated outputs, the figures the answer gates (`training.distribution_gates`) judge: how many
`</think>` and `<think>` each output holds, whether its reasoning is blank, and the visible answer after it.

It serves completions' `output_ids` and training rows' supervised part alike; nothing here imports dagster or a
tokenizer: callers pass `SpecialIds` and a `decode(ids) -> str` function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dagster_project.training.row_figures import ListColumn, list_buffers, list_chunks, row_of

if TYPE_CHECKING:
    from dagster_project.tokenizer import SpecialIds

# Reasoning is judged blank from its first tokens; only an all-whitespace start needs the whole decoded.
_BLANK_PROBE_TOKENS = 64

Decode = Callable[[Sequence[int]], str]


@dataclass
class OutputProfile:
    """Per-row structure of generated outputs: where `</think>` is, and what the answer after it says."""

    lengths: np.ndarray
    think_ends: np.ndarray  # how many `</think>`
    think_starts: np.ndarray  # how many `<think>` (the prompt opens the block, or the model once: `model_opens`)
    blank_reasoning: np.ndarray  # nothing but whitespace between the opening `<think>` and the first `</think>`
    answer_texts: list[str]  # decoded text after the last `</think>` (whole output if none), EOS dropped, stripped
    reasons: bool = True  # the model's template reasons (`SpecialIds.reasons`): else no think structure is judged
    model_opens: bool = False  # the model writes the opening `<think>` itself (its generation prompt does not)
    # Per row, whether its prompt ends inside an open think block (None: as the model's generation prompt does). A
    # template that opens the block may leave a turn without it (DeepSeek-R1's after tool results): that answer was
    # not asked to reason.
    prompt_opened: np.ndarray | None = None

    def opened_by_prompt(self) -> np.ndarray:
        if self.prompt_opened is not None:
            return self.prompt_opened
        return np.full(len(self), self.reasons and not self.model_opens, dtype=bool)

    def __len__(self) -> int:
        return int(self.lengths.size)

    @classmethod
    def concat(cls, profiles: Sequence[OutputProfile]) -> OutputProfile:
        def joined(name: str, dtype: Any) -> np.ndarray:
            return np.concatenate([getattr(p, name) for p in profiles]) if profiles else np.zeros(0, dtype)

        return cls(
            lengths=joined("lengths", np.int64),
            think_ends=joined("think_ends", np.int64),
            think_starts=joined("think_starts", np.int64),
            blank_reasoning=joined("blank_reasoning", bool),
            answer_texts=[text for p in profiles for text in p.answer_texts],
            **(_model_flags(profiles[0]) if profiles else {}),
            prompt_opened=np.concatenate([p.opened_by_prompt() for p in profiles]) if profiles else None,
        )


def _model_flags(profile: OutputProfile) -> dict[str, bool]:
    return {"reasons": profile.reasons, "model_opens": profile.model_opens}


def model_flags(special: SpecialIds) -> dict[str, bool]:
    """`OutputProfile`'s flags of the model `special` describes."""
    return {"reasons": special.reasons, "model_opens": special.reasons and not special.prompt_opens_reasoning}


def _is_blank(ids: np.ndarray, decode: Decode) -> bool:
    if decode(ids[:_BLANK_PROBE_TOKENS].tolist()).strip():
        return False
    return ids.size <= _BLANK_PROBE_TOKENS or not decode(ids.tolist()).strip()


def prompts_opening_reasoning(prompts: ListColumn, special: SpecialIds) -> np.ndarray:
    """Per prompt, whether it ends inside an open think block: its last `<think>` after its last `</think>`."""

    def opened(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
        rows = offsets.size - 1
        last_start, last_end = np.full(rows, -1), np.full(rows, -1)
        if special.reasons:
            for token, last in ((special.think_start, last_start), (special.think_end, last_end)):
                positions = np.flatnonzero(values == token)
                last[row_of(offsets, positions)] = positions  # ascending: the last one per row stays
        return last_start > last_end

    parts = [opened(*list_buffers(chunk)) for chunk in list_chunks(prompts)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def profile_outputs(
    outputs: ListColumn, special: SpecialIds, decode: Decode, prompts: ListColumn | None = None
) -> OutputProfile:
    """Thinking structure and answer text per output: completions' `output_ids` or training rows' supervised part;
    with their `prompts`, whether each prompt opened the think block (`OutputProfile.prompt_opened`)."""
    profiles = []
    eos = set(special.eos_ids)
    for chunk in list_chunks(outputs):
        offsets, values = list_buffers(chunk)
        rows = offsets.size - 1
        end_positions = np.flatnonzero(values == special.think_end) if special.reasons else np.zeros(0, np.int64)
        end_rows = row_of(offsets, end_positions)
        think_ends = np.bincount(end_rows, minlength=rows)
        start_positions = np.flatnonzero(values == special.think_start) if special.reasons else np.zeros(0, np.int64)
        start_rows = row_of(offsets, start_positions)
        think_starts = np.bincount(start_rows, minlength=rows)
        first_start = np.full(rows, -1)
        first_start[start_rows[::-1]] = start_positions[::-1]
        first_end = np.full(rows, -1)
        last_end = np.full(rows, -1)
        # Positions are ascending: assigning in order leaves the last one per row, reversed the first.
        last_end[end_rows] = end_positions
        first_end[end_rows[::-1]] = end_positions[::-1]
        blank = np.zeros(rows, dtype=bool)
        answers = []
        for row in range(rows):
            start, stop = offsets[row], offsets[row + 1]
            if first_end[row] >= 0:
                opened = first_start[row] + 1 if start <= first_start[row] < first_end[row] else start
                blank[row] = _is_blank(values[opened : first_end[row]], decode)
            answer = values[(last_end[row] + 1 if last_end[row] >= 0 else start) : stop]
            while answer.size and int(answer[-1]) in eos:
                answer = answer[:-1]
            answers.append(decode(answer.tolist()).strip())
        profiles.append(
            OutputProfile(np.diff(offsets), think_ends, think_starts, blank, answers, **model_flags(special))
        )
    profile = OutputProfile.concat(profiles)
    if prompts is not None:
        profile.prompt_opened = prompts_opening_reasoning(prompts, special)
    return profile
