"""The live quality watch's figures: every answer-level blocking gate over the answers a shard run has so far.

One definition per rule: each answer becomes one compact row (the per-row figures `training.gates` takes from a
shard, via its own `profile_outputs`), and judging rows rebuilds the `ShardProfile` those figures make and calls
`gates.shard_gates` and `gate_sets.share_gate` with the same `GateThresholds` and shares as the
`completions_quality` check, and `gates.concentration_gate` with the `training_set_gates` check's (the supervised
length's concentration is a training-set gate), so the watch and the gates give the same verdicts on the same rows.
Rows are small enough for the store (the fleet's figure sums every running shard's rows, `generation.line_stop`);
an answer's text is kept whole up to `_TEXT_KEPT` characters, a longer one as its head and a digest of the whole,
which keeps "same answer", "empty" and "short" exactly as the gates see them.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dagster_project.generation.line_hold import HoldExample
from dagster_project.generation.line_stop import Judgement, WatchFigure
from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import STATUS_OK
from dagster_project.training import gate_messages
from dagster_project.training.gate_result import GateResult
from dagster_project.training.gate_sets import (
    MAX_ERROR_SHARE,
    MAX_LENGTH_CAPPED_SHARE,
    SPEC_ACCEPT_LENGTH_FLOOR,
    share_gate,
)
from dagster_project.training.gates import GateThresholds, ShardProfile, concentration_gate, shard_gates
from dagster_project.training.output_profile import OutputProfile, model_flags, profile_outputs
from dagster_project.training.row_figures import row_digests

if TYPE_CHECKING:
    from dagster_project.tokenizer import SpecialIds

# The gates of `shard_gates` the watch judges answers by, every one holding the line: those of a completions shard,
# and the concentration of the supervised length (the training gate that would block the same rows one stage later,
# judged by that gate's thresholds: the seed's own signature, every answer one loss_mask sum). Where several fail, a
# hold names the first: a completions gate, which would block the shard a stage sooner.
CONCENTRATION = "loss_sum_concentration"
WATCHED_ANSWER_GATES = ("thinking_structure", "degenerate_answers", "short_answers", CONCENTRATION)
ACCEPT_LENGTH = "accept_length"  # shown beside them; a warning (MTP off), never a hold
WINDOW = 2000  # the rows a run keeps and stores: its most recent answers
_TEXT_KEPT = 64
_HEAD = 80

# One answer's compact row; positions, as lists are what JSON stores cheaply. FINISHED: its journal `finished_at`.
(
    EVENT,
    STATUS,
    FINISH,
    SERVER,
    LENGTH,
    THINK_ENDS,
    THINK_STARTS,
    BLANK,
    ANSWER,
    PROMPT,
    TOKENS,
    VERIFY,
    HEAD,
    FINISHED,
    PROMPT_OPENED,
) = range(15)


def answer_key(text: str) -> str:
    """The answer text, or for a long one its head and a digest of the whole: equal keys, equal answers."""
    if len(text) <= _TEXT_KEPT:
        return text
    return f"{text[:48]}…#{hashlib.sha256(text.encode()).hexdigest()[:12]}"


class AnswerQualityWatch:
    """`generation.line_stop.QualityWatch` by the gates' own rules, for a shard generated under `enable_thinking`."""

    def __init__(
        self,
        special: SpecialIds,
        decode: Callable[[Sequence[int]], str],
        *,
        settings: GenerationSettings,
        thresholds: GateThresholds | None = None,
        training_thresholds: GateThresholds | None = None,
        max_error_share: float = MAX_ERROR_SHARE,
        max_length_capped_share: float = MAX_LENGTH_CAPPED_SHARE,
    ):
        """`settings`: the shard's generation settings (thinking, and what `max_new_tokens: fit` cuts);
        `thresholds`: the `completions_quality` check's; `training_thresholds`: the `training_set_gates` check's,
        which `loss_sum_concentration` is judged by."""
        self.special, self.decode, self.settings = special, decode, settings
        self.enable_thinking = settings.enable_thinking
        self.thresholds = thresholds or GateThresholds()
        self.training_thresholds = training_thresholds or GateThresholds()
        self.max_error_share, self.max_length_capped_share = max_error_share, max_length_capped_share
        self._rows: deque[list] = deque(maxlen=WINDOW)
        self._seen = 0

    def observe(self, row: Mapping[str, Any]) -> None:
        self._rows.append(self.compact(row))
        self._seen += 1

    def rows(self) -> list[list]:
        return list(self._rows)

    def complete(self) -> bool:
        """Every answer observed is still among the rows (none left the window): an onset found in them is the
        run's first."""
        return self._seen <= WINDOW

    def compact(self, row: Mapping[str, Any]) -> list:
        """One journaled row as the watch keeps it."""
        ok = row["status"] == STATUS_OK
        outputs = pa.array([row.get("output_ids") or [] if ok else []], type=pa.list_(pa.int64()))
        prompts = pa.array([row.get("prompt_ids") or []], type=pa.list_(pa.int64()))
        profile = profile_outputs(outputs, self.special, self.decode, prompts)
        prompt = row_digests(prompts)[0]
        return [
            row["event_id"],
            row["status"] if ok else row.get("error_kind") or "error",
            self._answer_end(row) if ok else None,
            row.get("server") or "",
            int(profile.lengths[0]),
            int(profile.think_ends[0]),
            int(profile.think_starts[0]),
            bool(profile.blank_reasoning[0]),
            answer_key(profile.answer_texts[0]),
            prompt.hex(),
            int(row.get("completion_tokens") or 0) if ok else 0,
            int(row.get("spec_verify_ct") or 0) if ok else 0,
            self.decode((row.get("output_ids") or [])[:_HEAD])[:_HEAD]
            if ok
            else (row.get("error_message") or "")[:_HEAD],
            row.get("finished_at"),
            bool(profile.opened_by_prompt()[0]),
        ]

    def _answer_end(self, row: Mapping[str, Any]) -> str | None:
        """Its finish reason, `fit_cut` where fit cut it: not length-capped (`GenerationSettings.answer_end`)."""
        prompt_tokens = int(row.get("prompt_tokens") or len(row.get("prompt_ids") or []))
        return self.settings.answer_end(prompt_tokens, int(row.get("completion_tokens") or 0), row.get("finish_reason"))

    def judge(self, rows: Sequence[list], overridden: set[str] = frozenset()) -> Judgement:
        """Every watched gate over `rows`, each judged by the gate itself; the first failed one not overridden, and
        the onset: when the first answer (by finish time) that fails a failed holding gate on its own finished."""
        rows = sorted(rows, key=_finished_key)  # the watch's order: the fleet's rows come run by run
        answered = [row for row in rows if row[STATUS] == STATUS_OK]
        profile = _profile(answered, self.special)
        cut = _capped(answered)
        results = [
            *(
                r
                for r in shard_gates(
                    profile,
                    vocab_size=self.special.vocab_size,
                    enable_thinking=self.enable_thinking,
                    thresholds=self.thresholds,
                )
                if r.name in WATCHED_ANSWER_GATES and r.name != CONCENTRATION
            ),
            # Over the answers that become training rows: a length-capped one is excluded from them, and all of
            # them share one length (max_new_tokens), under length_capped_rate's own limit.
            concentration_gate(profile.loss_sums[~cut], self.training_thresholds),
        ]
        errors = [row for row in rows if row[STATUS] != STATUS_OK]
        capped = [row for row, capped_row in zip(answered, cut, strict=True) if capped_row]
        by_kind: dict[str, int] = {}
        for row in errors:
            by_kind[row[STATUS]] = by_kind.get(row[STATUS], 0) + 1
        shares = [
            (
                share_gate("error_rate", len(errors), len(rows), self.max_error_share, "ended in an error", by_kind),
                errors,
            ),
            (
                share_gate(
                    "length_capped_rate", len(capped), len(rows), self.max_length_capped_share, "hit max_new_tokens", {}
                ),
                capped,
            ),
        ]
        figures = [figure for result in [*results, *(result for result, _ in shares)] for figure in _figures(result)]
        figures.append(_accept_length(answered))
        holding = [f for f in figures if f.blocking and not f.passed and f.gate not in overridden]
        if not holding:
            return Judgement(figures, None)
        failed = holding[0]
        by_event = {row[EVENT]: row for row in rows}
        share_rows = dict((result.name, bad) for result, bad in shares)

        def failing(gate: str) -> list[str]:
            """The events that fail `gate` on their own, in the watch's order (the first few for a gate that
            samples its rows)."""
            if gate in share_rows:
                return [row[EVENT] for row in share_rows[gate]]
            result = next(r for r in results if r.name == gate)
            limits = self.training_thresholds if gate == CONCENTRATION else self.thresholds
            return gate_messages.example_ids(result, profile, limits)

        events = failing(failed.gate)
        examples = [
            HoldExample(event, by_event[event][HEAD], by_event[event][SERVER])
            for event in events[: gate_messages.EXAMPLES]
        ]
        servers = sorted({row[SERVER] for row in rows if row[SERVER]})
        firsts = [failing(gate)[:1] for gate in dict.fromkeys(f.gate for f in holding)]
        onset = _onset([by_event[first[0]] for first in firsts]) if all(firsts) else None
        return Judgement(figures, failed, examples, servers, onset)


def _finished_key(row: list) -> float:
    """A row's finish time; a row without one (written before rows carried it) sorts first."""
    finished = row[FINISHED] if len(row) > FINISHED else None
    return float("-inf") if finished is None else float(finished)


def _onset(first_failing: Sequence[list]) -> float | None:
    """The earliest finish among each failed gate's first failing answer; None (unknown) if a row has no finish
    time (or a gate names no row on its own: the caller's): the hold then condemns its runs' answers whole."""
    if any(_finished_key(row) == float("-inf") for row in first_failing):
        return None
    return min(_finished_key(row) for row in first_failing)


def _capped(answered: Sequence[list]) -> np.ndarray:
    return np.array([row[FINISH] == "length" for row in answered], dtype=bool)


def _profile(answered: Sequence[list], special: SpecialIds) -> ShardProfile:
    """The `ShardProfile` of a completions shard holding exactly these answers, as `profile_completion_batches`
    makes it."""
    lengths = np.array([row[LENGTH] for row in answered], dtype=np.int64)
    zeros = np.zeros(len(answered), dtype=np.int64)
    outputs = OutputProfile(
        lengths=lengths,
        think_ends=np.array([row[THINK_ENDS] for row in answered], dtype=np.int64),
        think_starts=np.array([row[THINK_STARTS] for row in answered], dtype=np.int64),
        blank_reasoning=np.array([row[BLANK] for row in answered], dtype=bool),
        answer_texts=[row[ANSWER] for row in answered],
        **model_flags(special),
    )
    # A row stored before rows carried it: as the model's generation prompt does.
    opens = outputs.opened_by_prompt()
    outputs.prompt_opened = np.array(
        [row[PROMPT_OPENED] if len(row) > PROMPT_OPENED else default for row, default in zip(answered, opens)],
        dtype=bool,
    )
    return ShardProfile(
        loss_sums=lengths,
        pairs=np.maximum(lengths - 1, 0),
        min_ids=zeros,
        max_ids=zeros,
        finished=np.array([row[FINISH] == "stop" for row in answered], dtype=bool),
        outputs=outputs,
        prompt_digests=[bytes.fromhex(row[PROMPT]) for row in answered],
        event_ids=[row[EVENT] for row in answered],
    )


# The share each gate compares with its threshold, and over how many rows: (figure, threshold, sample) keys.
_FIGURE_KEYS = {
    "loss_sum_concentration": ("top_share", "max_top_share", "rows"),
    "thinking_structure": ("bad_share", "max_bad_share", "finished_rows_checked"),
    "degenerate_answers": ("top_answer_share", "max_share", "distinct_prompts"),
    "error_rate": ("share", "max_share", "events"),
    "length_capped_rate": ("share", "max_share", "events"),
}


def _figures(result: GateResult) -> list[WatchFigure]:
    """The gate's figures: one per limit, each with its own threshold (short_answers has two: empty answers, and
    short ones), judged by the limit's own evidence."""
    meta = result.metadata
    if result.name == "short_answers":
        return [
            WatchFigure(
                result.name,
                float(meta.get(f"{limit}_share", 0.0)),
                float(meta.get(f"max_{limit}_share", 1.0)),
                int(meta.get("rows", 0)),
                not meta.get(f"{limit}_blocks", False),
                result.message,
                limit=limit,
            )
            for limit in ("empty", "short")
        ]
    figure_key, threshold_key, sample_key = _FIGURE_KEYS[result.name]
    figure, threshold, sample = meta.get(figure_key, 0.0), meta.get(threshold_key, 0.0), meta.get(sample_key, 0)
    return [WatchFigure(result.name, float(figure), float(threshold), int(sample), result.passed, result.message)]


def _accept_length(answered: Sequence[list]) -> WatchFigure:
    """Output tokens per verify pass; unknown (0) when no answer reported spec stats: MTP off."""
    spec = [row for row in answered if row[VERIFY]]
    tokens, passes = sum(row[TOKENS] for row in spec), sum(row[VERIFY] for row in spec)
    accept = tokens / passes if passes else 0.0
    passed = accept >= SPEC_ACCEPT_LENGTH_FLOOR
    text = f"accept length {accept:.2f} over {len(spec)} answers" if passes else "no spec-decoding stats: MTP off"
    return WatchFigure(
        ACCEPT_LENGTH, accept, SPEC_ACCEPT_LENGTH_FLOOR, len(spec), passed or not answered, text, blocking=False
    )
