"""Quality gates on generated answers and training rows: the checks that would have caught "loss_mask sum = 6".

The last attempt at this dataset shipped 914K rows of which 87% had a loss_mask sum of exactly 6: empty
reasoning plus "OK." as the answer. Every gate below looks at one shard and returns a `GateResult`: `passed`,
one line a person understands at a glance, and every figure behind it.

Two layers, both plain numpy over Arrow list columns, one chunk at a time:

* **per-row figures** — `list_lengths`, `row_sums`, `supervised_pairs`, `id_bounds`, `row_digests`,
  `split_by_mask` (in `training.row_figures`), and `profile_outputs` (in `training.output_profile`: thinking
  structure and answer text of generated outputs);
* **gates over those figures** — `loss_sum_floor`, `loss_sum_concentration`, `consecutive_supervised`,
  `ids_in_vocabulary`, `thinking_structure`, `degenerate_answers`, `short_answers`, `ids_match_completions`,
  `length_loss`; `malformed_tool_calls` (the model's own tool calls) lives beside them in
  `training.tool_call_gate`.

They serve completions (`output_ids` is the would-be supervised part) and training rows (the part under
`loss_mask == 1`) alike; end to end, per shard:

    profile = profile_completion_batches(batches, special, tokenizer.decode)   # or profile_training_batches
    results = shard_gates(profile, vocab_size=special.vocab_size, enable_thinking=settings.enable_thinking)

Nothing here imports dagster or a tokenizer: callers pass `SpecialIds` and a `decode(ids) -> str` function.

Default thresholds, each a parameter. A share limit is the largest true share a healthy shard may have: a gate
blocks only on evidence that the shard's true share is above it, at a false-block rate of 1 in 10,000 at the limit
itself (`training.evidence`: the exact binomial tail for the sample at hand, so one rule serves a 20-row shard, a
500-row one and a watch over the first answers of a run). A broken shard is far over its limits: the seed's 87% of
"OK." blocks every one of these gates from 20 rows.

* **loss floor 32 supervised tokens, at most 2% of rows below it.** DFlash predicts a block of 16 (the
  anchor plus 15 targets), so a row needs more than 16 supervised tokens for one full block; 32 = 2 × the
  block size leaves at least 17 anchors with full targets. Thinking-on answers average ~2,400 tokens, so a
  row under 32 is an anomaly, and a few per cent of them is a broken shard.
* **no single loss_mask sum on more than 5% of rows** (and never on fewer than 5 rows). Natural lengths spread
  over thousands of values; one value on 87% is a template. Any sum could be the top one, so its evidence is
  weighed among many values.
* **every row has a supervised pair** (two consecutive supervised tokens): SpecForge's DFlash rejects a
  row without one, and a batch without any raises.
* **thinking structure** (thinking on, a template that reasons): in a finished answer, exactly one `</think>`, no
  `<think>` (one, for a model that opens the block itself), and non-blank reasoning before it; at most 1% of
  finished answers may break this. An answer whose prompt left the block closed where the template opens it
  elsewhere (DeepSeek-R1's reply to tool results) was not asked to reason and is not judged.
* **degenerate answers**: no answer text on more than 5% of distinct prompts (never on fewer than 5), weighed
  among many answers like the loss sums.
* **short answers**: at most 10% of finished answers under 8 characters, at most 1% empty.
* **malformed tool calls** (`training.tool_call_gate`): at most 5% of the tool calls written in finished answers
  break the Qwen3.6 `<tool_call>` format.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dagster_project.training.evidence import FALSE_BLOCK_RATE, weigh
from dagster_project.training.lengths import LengthFigures
from dagster_project.training.output_profile import Decode, OutputProfile, profile_outputs
from dagster_project.training.row_figures import (
    adjacent_per_row,
    id_bounds,
    ids_digest,
    list_buffers,
    list_lengths,
    row_digests,
    row_sums,
    split_by_mask,
    supervised_pairs,
)

if TYPE_CHECKING:
    from dagster_project.tokenizer import SpecialIds

LOSS_FLOOR = 32
MAX_SHARE_BELOW_FLOOR = 0.02
MAX_TOP_LOSS_SUM_SHARE = 0.05
MIN_REPEATS = 5
MIN_SUPERVISED_PAIRS = 1
MAX_BAD_THINKING_SHARE = 0.01
MAX_DEGENERATE_SHARE = 0.05
SHORT_ANSWER_CHARS = 8
MAX_SHORT_ANSWER_SHARE = 0.10
MAX_EMPTY_ANSWER_SHARE = 0.01

_HISTOGRAM_TOP = 10
_SAMPLE = 5


@dataclass(frozen=True)
class GateResult:
    name: str
    passed: bool
    message: str
    metadata: dict[str, Any] = field(default_factory=dict)


def _verdict(passed: bool, text: str) -> str:
    return f"{'ok' if passed else 'BLOCKED'}: {text}"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


# ---- gates ----------------------------------------------------------------------------------------


def loss_sum_histogram(loss_sums: np.ndarray, top: int = _HISTOGRAM_TOP) -> dict[str, int]:
    """The most common loss_mask sums and their row counts, most common first."""
    values, counts = np.unique(np.asarray(loss_sums), return_counts=True)
    order = np.argsort(-counts, kind="stable")[:top]
    return {str(int(values[i])): int(counts[i]) for i in order}


def _quantiles(values: np.ndarray) -> dict[str, float]:
    if not values.size:
        return {}
    points = np.percentile(values, [0, 5, 50, 95, 100])
    return dict(zip(("min", "p5", "median", "p95", "max"), (float(p) for p in points), strict=True))


def loss_sum_floor(
    loss_sums: np.ndarray,
    *,
    floor: int = LOSS_FLOOR,
    max_share_below: float = MAX_SHARE_BELOW_FLOOR,
    false_block_rate: float = FALSE_BLOCK_RATE,
) -> GateResult:
    """Few rows may have fewer than `floor` supervised tokens; none at all means the shard is empty."""
    sums = np.asarray(loss_sums)
    rows, below = int(sums.size), int((sums < floor).sum())
    evidence = weigh(below, rows, max_share_below, false_block_rate=false_block_rate)
    metadata = {
        "rows": rows,
        "floor": floor,
        "rows_below_floor": below,
        "share_below_floor": _share(below, rows),
        "max_share_below_floor": max_share_below,
        **evidence.metadata(),
        "loss_sum_quantiles": _quantiles(sums),
    }
    if not rows:
        return GateResult("loss_sum_floor", False, _verdict(False, "the shard has no rows"), metadata)
    passed = not evidence.blocks
    text = (
        f"{_pct(below, rows)} of rows ({below}/{rows}) have fewer than {floor} supervised tokens "
        f"(median {np.median(sums):.0f}); {evidence.bound_text()}"
    )
    return GateResult("loss_sum_floor", passed, _verdict(passed, text), metadata)


def loss_sum_concentration(
    loss_sums: np.ndarray,
    *,
    max_top_share: float = MAX_TOP_LOSS_SUM_SHARE,
    min_repeats: int = MIN_REPEATS,
    floor: int = LOSS_FLOOR,
    false_block_rate: float = FALSE_BLOCK_RATE,
) -> GateResult:
    """No single loss_mask sum may dominate: natural answer lengths spread; a template does not.

    Any sum could be the most common one, so the evidence is weighed among many (`training.evidence`): whatever
    the healthy spread of lengths, a shard where no sum's true share exceeds `max_top_share` is blocked at most
    once in 1 / `false_block_rate`; and never below `min_repeats` rows on the sum.
    """
    sums = np.asarray(loss_sums)
    rows = int(sums.size)
    histogram = loss_sum_histogram(sums)
    metadata: dict[str, Any] = {
        "rows": rows,
        "max_top_share": max_top_share,
        "min_repeats": min_repeats,
        "distinct_sums": int(np.unique(sums).size),
        "top_sums": histogram,
    }
    if not rows:
        return GateResult("loss_sum_concentration", True, _verdict(True, "no rows to check"), metadata)
    top_value, top_count = next((int(v), c) for v, c in histogram.items())
    evidence = weigh(
        top_count, rows, max_top_share, false_block_rate=false_block_rate, among_many=True, min_count=min_repeats
    )
    metadata.update(top_sum=top_value, top_count=top_count, top_share=_share(top_count, rows), **evidence.metadata())
    passed = not evidence.blocks
    covered = f"{_pct(top_count, rows)} of rows ({top_count}/{rows})"
    if passed:
        text = f"the most common loss_mask sum ({top_value}) covers {covered}; {evidence.bound_text()}"
    else:
        text = f"{covered} have loss_mask sum exactly {top_value} — " + (
            "the signature of empty reasoning + a one-word answer such as 'OK.'"
            if top_value < floor
            else "one output shape repeated across the shard"
        )
        text += f"; {evidence.bound_text()}"
    return GateResult("loss_sum_concentration", passed, _verdict(passed, text), metadata)


def consecutive_supervised(pair_counts: np.ndarray, *, min_pairs: int = MIN_SUPERVISED_PAIRS) -> GateResult:
    """Every row needs two consecutive supervised tokens: without one DFlash has no anchor to train on."""
    pairs = np.asarray(pair_counts)
    rows, short = int(pairs.size), int((pairs < min_pairs).sum())
    metadata = {
        "rows": rows,
        "min_pairs": min_pairs,
        "rows_without_enough_pairs": short,
        "min_pairs_in_a_row": int(pairs.min()) if rows else 0,
        "sample_rows": np.flatnonzero(pairs < min_pairs)[:_SAMPLE].tolist(),
    }
    passed = short == 0
    text = (
        f"every row has at least {min_pairs} pair(s) of consecutive supervised tokens"
        if passed
        else f"{short}/{rows} rows have fewer than {min_pairs} pair(s) of consecutive supervised tokens "
        "— DFlash cannot place an anchor in them"
    )
    return GateResult("consecutive_supervised", passed, _verdict(passed, text), metadata)


def ids_in_vocabulary(min_ids: np.ndarray, max_ids: np.ndarray, vocab_size: int) -> GateResult:
    """Every id lies in [0, vocab_size): anything else is a corrupted row or a different tokenizer."""
    low, high = np.asarray(min_ids), np.asarray(max_ids)
    bad = (low < 0) | (high >= vocab_size)
    rows, bad_rows = int(low.size), int(bad.sum())
    metadata = {
        "rows": rows,
        "vocab_size": vocab_size,
        "rows_out_of_range": bad_rows,
        "min_id": int(low.min()) if rows else 0,
        "max_id": int(high.max()) if rows else -1,
        "sample_rows": np.flatnonzero(bad)[:_SAMPLE].tolist(),
    }
    passed = bad_rows == 0
    text = (
        f"all ids lie in [0, {vocab_size}) (largest {metadata['max_id']})"
        if passed
        else f"{bad_rows}/{rows} rows hold ids outside [0, {vocab_size}) (smallest {metadata['min_id']}, "
        f"largest {metadata['max_id']}) — wrong tokenizer or corrupted rows"
    )
    return GateResult("ids_in_vocabulary", passed, _verdict(passed, text), metadata)


def thinking_structure(
    profile: OutputProfile,
    finished: np.ndarray,
    *,
    enable_thinking: bool = True,
    max_bad_share: float = MAX_BAD_THINKING_SHARE,
    false_block_rate: float = FALSE_BLOCK_RATE,
) -> GateResult:
    """Finished answers close the think block once after real reasoning (thinking on), or carry no markers (off).

    `finished` selects the rows to judge: answers that ended on their own (`stop`) and were not cut, since
    a length-capped or truncated answer may legitimately stop inside its reasoning.
    """
    finished = np.asarray(finished, dtype=bool)
    if not profile.reasons:
        text = "the model's chat template does not reason: no think block to check"
        return GateResult("thinking_structure", True, _verdict(True, text), {"reasons": False, "rows": len(profile)})
    prompt_opened = profile.opened_by_prompt()
    # A model whose generation prompt leaves the think block to it (Qwen3) opens it once itself. Where a template
    # that opens the block left a turn without it (DeepSeek-R1's reply to tool results), the answer was not asked
    # to reason: it is not judged.
    not_asked = finished & ~prompt_opened & (not profile.model_opens) if enable_thinking else np.zeros_like(finished)
    finished = finished & ~not_asked
    judged = int(finished.sum())
    opened_by_model = (~prompt_opened).astype(np.int64) if enable_thinking else 0
    stray_start = finished & (profile.think_starts > opened_by_model)
    if enable_thinking:
        problems = {
            "no_think_end": finished & (profile.think_ends == 0),
            "several_think_ends": finished & (profile.think_ends > 1),
            "stray_think_start": stray_start,
            "blank_reasoning": finished & (profile.think_ends > 0) & profile.blank_reasoning,
        }
    else:
        problems = {
            "think_end_with_thinking_off": finished & (profile.think_ends > 0),
            "stray_think_start": stray_start,
        }
    bad = np.logical_or.reduce(list(problems.values()))
    bad_rows = int(bad.sum())
    counts = {name: int(rows.sum()) for name, rows in problems.items()}
    evidence = weigh(bad_rows, judged, max_bad_share, false_block_rate=false_block_rate)
    metadata = {
        "enable_thinking": enable_thinking,
        "rows": len(profile),
        "finished_rows_checked": judged,
        "not_asked_to_reason": int(not_asked.sum()),
        "bad_rows": bad_rows,
        "bad_share": _share(bad_rows, judged),
        "max_bad_share": max_bad_share,
        **evidence.metadata(),
        **counts,
        "sample_rows": np.flatnonzero(bad)[:_SAMPLE].tolist(),
    }
    if not judged:
        text = f"no finished answers to check ({len(profile)} rows, all length-capped or truncated)"
        return GateResult("thinking_structure", True, _verdict(True, text), metadata)
    passed = not evidence.blocks
    if passed:
        shape = "close </think> once after non-blank reasoning" if enable_thinking else "carry no think markers"
        text = f"{judged - bad_rows}/{judged} finished answers {shape}; {bad_rows} bad, "
        text += evidence.bound_text("answers")
    else:
        worst = max(counts, key=counts.get)
        described = {
            "no_think_end": "never close the think block (no </think>)",
            "several_think_ends": "close the think block more than once",
            "stray_think_start": "open a second <think>",
            "blank_reasoning": "have empty reasoning before </think> — the model is not thinking",
            "think_end_with_thinking_off": "contain </think> although thinking is off",
        }[worst]
        text = f"{_pct(counts[worst], judged)} of finished answers ({counts[worst]}/{judged}) {described}"
        if len(counts) > 1 and bad_rows > counts[worst]:
            text += f" ({bad_rows} bad in all)"
        text += f"; {evidence.bound_text()}"
    return GateResult("thinking_structure", passed, _verdict(passed, text), metadata)


def degenerate_answers(
    answer_texts: Sequence[str],
    prompt_digests: Sequence[bytes],
    *,
    max_share: float = MAX_DEGENERATE_SHARE,
    min_repeats: int = MIN_REPEATS,
    false_block_rate: float = FALSE_BLOCK_RATE,
) -> GateResult:
    """No answer text may recur across many distinct prompts (the "OK." for everything failure).

    The same answer to the same prompt (duplicated source rows) is not degenerate, so answers are counted
    over distinct prompts. Any answer could be the most repeated one: the evidence is weighed among many, as
    for `loss_sum_concentration`.
    """
    prompts_per_answer: dict[str, set[bytes]] = {}
    for text, prompt in zip(answer_texts, prompt_digests, strict=True):
        prompts_per_answer.setdefault(text, set()).add(prompt)
    distinct_prompts = len(set(prompt_digests))
    top = Counter({text: len(prompts) for text, prompts in prompts_per_answer.items()}).most_common(_SAMPLE)
    metadata: dict[str, Any] = {
        "rows": len(answer_texts),
        "distinct_prompts": distinct_prompts,
        "distinct_answers": len(prompts_per_answer),
        "max_share": max_share,
        "min_repeats": min_repeats,
        "top_answers": [{"answer": text[:200], "distinct_prompts": n} for text, n in top],
    }
    if not top:
        return GateResult("degenerate_answers", True, _verdict(True, "no answers to check"), metadata)
    answer, count = top[0]
    evidence = weigh(
        count, distinct_prompts, max_share, false_block_rate=false_block_rate, among_many=True, min_count=min_repeats
    )
    metadata.update(top_answer_prompts=count, top_answer_share=_share(count, distinct_prompts), **evidence.metadata())
    passed = not evidence.blocks
    shown = repr(answer[:60] + ("…" if len(answer) > 60 else ""))
    covered = f"{_pct(count, distinct_prompts)} of distinct prompts ({count}/{distinct_prompts})"
    if passed:
        text = f"the most repeated answer covers {covered}; {evidence.bound_text('distinct prompts')}"
    else:
        text = (
            f"{covered} got the same answer {shown} — one answer for everything, whatever was asked; "
            f"{evidence.bound_text('distinct prompts')}"
        )
    return GateResult("degenerate_answers", passed, _verdict(passed, text), metadata)


def short_answers(
    answer_texts: Sequence[str],
    *,
    min_chars: int = SHORT_ANSWER_CHARS,
    max_short_share: float = MAX_SHORT_ANSWER_SHARE,
    max_empty_share: float = MAX_EMPTY_ANSWER_SHARE,
    false_block_rate: float = FALSE_BLOCK_RATE,
) -> GateResult:
    """Empty and very short visible answers, as a share of the finished answers given."""
    rows = len(answer_texts)
    empty = sum(1 for text in answer_texts if not text)
    short = sum(1 for text in answer_texts if len(text) < min_chars)
    examples = Counter(text for text in answer_texts if len(text) < min_chars).most_common(_SAMPLE)
    empty_evidence = weigh(empty, rows, max_empty_share, false_block_rate=false_block_rate)
    short_evidence = weigh(short, rows, max_short_share, false_block_rate=false_block_rate)
    metadata = {
        "rows": rows,
        "empty_answers": empty,
        "short_answers": short,
        "empty_share": _share(empty, rows),
        "short_share": _share(short, rows),
        "min_chars": min_chars,
        "max_short_share": max_short_share,
        "max_empty_share": max_empty_share,
        **empty_evidence.metadata("empty_"),
        **short_evidence.metadata("short_"),
        "common_short_answers": {text: n for text, n in examples},
    }
    if not rows:
        return GateResult("short_answers", True, _verdict(True, "no finished answers to check"), metadata)
    if empty_evidence.blocks:
        text = f"{_pct(empty, rows)} of finished answers ({empty}/{rows}) are empty after </think>"
        text += f"; {empty_evidence.bound_text('answers')}"
    else:
        text = (
            f"{_pct(short, rows)} of finished answers ({short}/{rows}) are shorter than {min_chars} characters"
            + (f", most often {examples[0][0]!r}" if examples else "")
            + f"; {short_evidence.bound_text('answers')}"
        )
    passed = not (empty_evidence.blocks or short_evidence.blocks)
    return GateResult("short_answers", passed, _verdict(passed, text), metadata)


def length_loss(figures: LengthFigures, *, max_lost_share: float) -> GateResult:
    """Few supervised tokens may be lost to the trainer's sequence length (`training.lengths`)."""
    lost, total = figures.supervised_tokens_beyond, figures.supervised_tokens
    metadata = {
        "max_length": figures.max_length,
        "length_policy": figures.policy,
        "rows": figures.rows,
        "rows_over_max_length": figures.rows_over,
        "supervised_tokens": total,
        "supervised_tokens_lost": lost,
        "lost_share": figures.lost_share,
        "max_lost_share": max_lost_share,
        "length_histogram": figures.histogram,
    }
    passed = figures.lost_share <= max_lost_share
    how = {"keep": "would be cut by a trainer at", "truncate": "were cut at", "drop": "were dropped over"}
    text = (
        f"{figures.lost_share:.1%} of supervised tokens ({lost}/{total}) {how[figures.policy]} max_length "
        f"{figures.max_length} ({figures.rows_over}/{figures.rows} rows longer); limit {max_lost_share:.0%}"
    )
    return GateResult("length_loss", passed, _verdict(passed, text), metadata)


# ---- identity with the completions ----------------------------------------------------------------


@dataclass(frozen=True)
class RowDigest:
    """What a training row claims about its generation event, small enough to hold for a whole shard."""

    prompt_tokens: int
    supervised_tokens: int
    prompt_digest: bytes
    supervised_digest: bytes
    mask_is_boundary: bool  # zeros over the prompt, then ones: the engine boundary and nothing else


def ids_match_completions(rows: Mapping[str, RowDigest], completion_batches: Iterable[pa.RecordBatch]) -> GateResult:
    """Each training row is its event's `prompt_ids` + `output_ids` exactly (a prefix of the output when
    truncated), with the loss mask on the output only: nothing was re-tokenized, shifted or mixed up."""
    problems: dict[str, list[str]] = {"prompt_differs": [], "output_differs": [], "duplicated_in_completions": []}
    found: set[str] = set()
    for batch in completion_batches:
        events = batch.column("event_id").to_pylist()
        wanted = [i for i, event in enumerate(events) if event in rows]
        if not wanted:
            continue
        picked = batch.take(pa.array(wanted))
        prompt_offsets, prompt_values = list_buffers(picked.column("prompt_ids"))
        output_offsets, output_values = list_buffers(picked.column("output_ids"))
        for j, i in enumerate(wanted):
            event, row = events[i], rows[events[i]]
            if event in found:
                problems["duplicated_in_completions"].append(event)
                continue
            found.add(event)
            prompt = prompt_values[prompt_offsets[j] : prompt_offsets[j + 1]]
            output = output_values[output_offsets[j] : output_offsets[j + 1]]
            if prompt.size != row.prompt_tokens or ids_digest(prompt) != row.prompt_digest:
                problems["prompt_differs"].append(event)
            elif (
                output.size < row.supervised_tokens
                or ids_digest(output[: row.supervised_tokens]) != row.supervised_digest
            ):
                problems["output_differs"].append(event)
    problems["not_in_completions"] = sorted(rows.keys() - found)
    problems["mask_not_at_boundary"] = sorted(event for event, row in rows.items() if not row.mask_is_boundary)
    counts = {name: len(events) for name, events in problems.items()}
    bad = sum(counts.values())
    metadata = {
        "rows": len(rows),
        "matched_rows": len(found) - counts["prompt_differs"] - counts["output_differs"],
        **counts,
        "samples": {name: events[:_SAMPLE] for name, events in problems.items() if events},
    }
    passed = bad == 0
    if passed:
        text = f"all {len(rows)} rows are their completions' prompt_ids + output_ids, mask 1 exactly over the output"
    else:
        described = {
            "prompt_differs": "have a prompt that differs from the ids sent to SGLang",
            "output_differs": "have supervised ids that differ from the ids SGLang returned",
            "duplicated_in_completions": "match an event recorded twice in the completions",
            "not_in_completions": "belong to no event of the completions shard",
            "mask_not_at_boundary": "have a loss mask that is not 0 over the prompt then 1 over the output",
        }
        worst = max(counts, key=counts.get)
        text = f"{counts[worst]}/{len(rows)} rows {described[worst]}" + (
            f" ({bad} problems in all)" if bad > counts[worst] else ""
        )
    return GateResult("ids_match_completions", passed, _verdict(passed, text), metadata)


# ---- a shard, end to end: completions or training rows --------------------------------------------

TRAINING_GATE_COLUMNS = ["event_id", "input_ids", "loss_mask", "finish_reason", "truncated", "server"]
COMPLETION_GATE_COLUMNS = ["event_id", "status", "prompt_ids", "output_ids", "finish_reason", "server"]


@dataclass(frozen=True)
class GateThresholds:
    """Every threshold of `shard_gates`; the defaults and their reasons are in this module's docstring."""

    loss_floor: int = field(default=LOSS_FLOOR, metadata={"help": "Supervised tokens a row should have at least."})
    max_share_below_floor: float = field(
        default=MAX_SHARE_BELOW_FLOOR, metadata={"help": "Largest share of rows under the loss floor."}
    )
    max_top_loss_sum_share: float = field(
        default=MAX_TOP_LOSS_SUM_SHARE, metadata={"help": "Largest share of rows on one loss_mask sum."}
    )
    min_repeats: int = field(
        default=MIN_REPEATS, metadata={"help": "A sum or answer must recur this often before its share can block."}
    )
    min_supervised_pairs: int = field(
        default=MIN_SUPERVISED_PAIRS, metadata={"help": "Consecutive supervised token pairs every row needs."}
    )
    max_bad_thinking_share: float = field(
        default=MAX_BAD_THINKING_SHARE, metadata={"help": "Largest share of finished answers with broken thinking."}
    )
    max_degenerate_share: float = field(
        default=MAX_DEGENERATE_SHARE, metadata={"help": "Largest share of distinct prompts given one answer text."}
    )
    short_answer_chars: int = field(
        default=SHORT_ANSWER_CHARS, metadata={"help": "A visible answer shorter than this is short."}
    )
    max_short_answer_share: float = field(
        default=MAX_SHORT_ANSWER_SHARE, metadata={"help": "Largest share of short finished answers."}
    )
    max_empty_answer_share: float = field(
        default=MAX_EMPTY_ANSWER_SHARE, metadata={"help": "Largest share of empty finished answers."}
    )


@dataclass
class ShardProfile:
    """Every per-row figure the gates need, gathered in one streaming pass over a shard."""

    loss_sums: np.ndarray  # supervised tokens (for completions: output tokens, all of which will be)
    pairs: np.ndarray  # consecutive supervised pairs
    min_ids: np.ndarray
    max_ids: np.ndarray
    finished: np.ndarray  # ended with `stop` and not truncated: the rows whose answers can be judged
    outputs: OutputProfile
    prompt_digests: list[bytes]
    event_ids: list[str]  # per row: what a blocked gate names as its examples
    servers: list[str | None] = field(default_factory=list)  # per row: who wrote the answer (what a gate names)
    digests: dict[str, RowDigest] = field(default_factory=dict)  # training rows only, for `ids_match_completions`


def _part(prompts: pa.Array, outputs: pa.Array, special: SpecialIds, decode: Decode, **figures: Any) -> dict[str, Any]:
    profile = profile_outputs(outputs, special, decode, prompts)
    return {**figures, "outputs": profile, "prompt_digests": row_digests(prompts)}


def _joined(parts: list[dict[str, Any]], digests: dict[str, RowDigest]) -> ShardProfile:
    def joined(name: str, dtype: Any) -> np.ndarray:
        return np.concatenate([part[name] for part in parts]) if parts else np.zeros(0, dtype)

    return ShardProfile(
        loss_sums=joined("loss_sums", np.int64),
        pairs=joined("pairs", np.int64),
        min_ids=joined("min_ids", np.int64),
        max_ids=joined("max_ids", np.int64),
        finished=joined("finished", bool),
        outputs=OutputProfile.concat([part["outputs"] for part in parts]),
        prompt_digests=[key for part in parts for key in part["prompt_digests"]],
        event_ids=[event for part in parts for event in part["event_ids"]],
        servers=[server for part in parts for server in part["servers"]],
        digests=digests,
    )


def _servers(batch: pa.RecordBatch) -> list[str | None]:
    return batch.column("server").to_pylist() if "server" in batch.schema.names else [None] * batch.num_rows


def _stopped(batch: pa.RecordBatch) -> np.ndarray:
    return np.asarray(batch.column("finish_reason").to_pylist(), dtype=object) == "stop"


def profile_training_batches(batches: Iterable[pa.RecordBatch], special: SpecialIds, decode: Decode) -> ShardProfile:
    """Profile training rows (`TRAINING_GATE_COLUMNS`): the supervised part is what is judged as the answer."""
    parts: list[dict[str, Any]] = []
    digests: dict[str, RowDigest] = {}
    for batch in batches:
        ids, mask = batch.column("input_ids"), batch.column("loss_mask")
        prompts, supervised = split_by_mask(ids, mask)
        prompt_lengths, supervised_lengths = list_lengths(prompts), list_lengths(supervised)
        # Zeros then ones, never a one followed by a zero: the mask is exactly the prompt/output boundary.
        boundary = adjacent_per_row(mask, lambda here, after: (here == 1) & (after == 0)) == 0
        min_ids, max_ids = id_bounds(ids)
        part = _part(
            prompts,
            supervised,
            special,
            decode,
            loss_sums=row_sums(mask),
            pairs=supervised_pairs(mask),
            min_ids=min_ids,
            max_ids=max_ids,
            finished=_stopped(batch) & ~batch.column("truncated").to_numpy(zero_copy_only=False),
            event_ids=batch.column("event_id").to_pylist(),
            servers=_servers(batch),
        )
        rows = zip(batch.column("event_id").to_pylist(), part["prompt_digests"], row_digests(supervised), strict=True)
        for i, (event, prompt, output) in enumerate(rows):
            digests[event] = RowDigest(
                int(prompt_lengths[i]), int(supervised_lengths[i]), prompt, output, bool(boundary[i])
            )
        parts.append(part)
    return _joined(parts, digests)


def profile_completion_batches(batches: Iterable[pa.RecordBatch], special: SpecialIds, decode: Decode) -> ShardProfile:
    """Profile completions (`COMPLETION_GATE_COLUMNS`) as the training rows they would become.

    Only answered events (`status == "ok"`) are profiled; error rates are the completions checks' own.
    """
    parts: list[dict[str, Any]] = []
    for batch in batches:
        answered = batch.filter(pa.array(np.asarray(batch.column("status").to_pylist(), dtype=object) == "ok"))
        prompts, outputs = answered.column("prompt_ids"), answered.column("output_ids")
        lengths = list_lengths(outputs)
        (prompt_min, output_min), (prompt_max, output_max) = zip(id_bounds(prompts), id_bounds(outputs), strict=True)
        parts.append(
            _part(
                prompts,
                outputs,
                special,
                decode,
                loss_sums=lengths,
                pairs=np.maximum(lengths - 1, 0),
                min_ids=np.minimum(prompt_min, output_min),
                max_ids=np.maximum(prompt_max, output_max),
                finished=_stopped(answered),
                event_ids=answered.column("event_id").to_pylist(),
                servers=_servers(answered),
            )
        )
    return _joined(parts, {})


def concentration_gate(
    loss_sums: np.ndarray, thresholds: GateThresholds, *, false_block_rate: float = FALSE_BLOCK_RATE
) -> GateResult:
    """`loss_sum_concentration` by `thresholds`: as `shard_gates` judges a training shard, and the quality watch
    its answers (`training.watch_figures`), both by the `training_set_gates` check's thresholds."""
    return loss_sum_concentration(
        loss_sums,
        max_top_share=thresholds.max_top_loss_sum_share,
        min_repeats=thresholds.min_repeats,
        floor=thresholds.loss_floor,
        false_block_rate=false_block_rate,
    )


def shard_gates(
    profile: ShardProfile,
    *,
    vocab_size: int,
    enable_thinking: bool,
    thresholds: GateThresholds = GateThresholds(),
    false_block_rate: float = FALSE_BLOCK_RATE,
) -> list[GateResult]:
    """Every row-level gate of a shard (for training rows, `ids_match_completions` is the one more); the share
    gates block at most once in 1 / `false_block_rate` at their limits (`training.evidence`)."""
    rate = false_block_rate
    finished = profile.finished
    finished_answers = [text for text, keep in zip(profile.outputs.answer_texts, finished, strict=True) if keep]
    finished_prompts = [key for key, keep in zip(profile.prompt_digests, finished, strict=True) if keep]
    return [
        loss_sum_floor(
            profile.loss_sums,
            floor=thresholds.loss_floor,
            max_share_below=thresholds.max_share_below_floor,
            false_block_rate=rate,
        ),
        concentration_gate(profile.loss_sums, thresholds, false_block_rate=rate),
        consecutive_supervised(profile.pairs, min_pairs=thresholds.min_supervised_pairs),
        ids_in_vocabulary(profile.min_ids, profile.max_ids, vocab_size),
        thinking_structure(
            profile.outputs,
            finished,
            enable_thinking=enable_thinking,
            max_bad_share=thresholds.max_bad_thinking_share,
            false_block_rate=rate,
        ),
        degenerate_answers(
            finished_answers,
            finished_prompts,
            max_share=thresholds.max_degenerate_share,
            min_repeats=thresholds.min_repeats,
            false_block_rate=rate,
        ),
        short_answers(
            finished_answers,
            min_chars=thresholds.short_answer_chars,
            max_short_share=thresholds.max_short_answer_share,
            max_empty_share=thresholds.max_empty_answer_share,
            false_block_rate=rate,
        ),
    ]
