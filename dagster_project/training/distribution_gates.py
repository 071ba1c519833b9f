"""The share gates: each weighs how many of a shard's rows or answers show a sign of a broken generation against the
largest share a healthy shard may have (`training.evidence`), so one rule serves a 20-row shard, a 500-row one and a
watch over a run's first answers. Over the supervised lengths: `loss_sum_floor`, `loss_sum_concentration` (the seed's
"loss_mask sum = 6"); over the finished answers' text: `thinking_structure`, `degenerate_answers`, `short_answers`.
Their default thresholds and the reasons for them: `training.gates`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from dagster_project.training.evidence import FALSE_BLOCK_RATE, weigh
from dagster_project.training.gate_result import SAMPLE, GateResult, percent, share_of, verdict
from dagster_project.training.output_profile import OutputProfile

LOSS_FLOOR = 32
MAX_SHARE_BELOW_FLOOR = 0.02
MAX_TOP_LOSS_SUM_SHARE = 0.05
MIN_REPEATS = 5
MAX_BAD_THINKING_SHARE = 0.01
MAX_DEGENERATE_SHARE = 0.05
SHORT_ANSWER_CHARS = 8
MAX_SHORT_ANSWER_SHARE = 0.10
MAX_EMPTY_ANSWER_SHARE = 0.01

_HISTOGRAM_TOP = 10


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
        "share_below_floor": share_of(below, rows),
        "max_share_below_floor": max_share_below,
        **evidence.metadata(),
        "loss_sum_quantiles": _quantiles(sums),
    }
    if not rows:
        return GateResult("loss_sum_floor", False, verdict(False, "the shard has no rows"), metadata)
    passed = not evidence.blocks
    text = (
        f"{percent(below, rows)} of rows ({below}/{rows}) have fewer than {floor} supervised tokens "
        f"(median {np.median(sums):.0f}); {evidence.bound_text()}"
    )
    return GateResult("loss_sum_floor", passed, verdict(passed, text), metadata)


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
        return GateResult("loss_sum_concentration", True, verdict(True, "no rows to check"), metadata)
    top_value, top_count = next((int(v), c) for v, c in histogram.items())
    evidence = weigh(
        top_count, rows, max_top_share, false_block_rate=false_block_rate, among_many=True, min_count=min_repeats
    )
    metadata.update(top_sum=top_value, top_count=top_count, top_share=share_of(top_count, rows), **evidence.metadata())
    passed = not evidence.blocks
    covered = f"{percent(top_count, rows)} of rows ({top_count}/{rows})"
    if passed:
        text = f"the most common loss_mask sum ({top_value}) covers {covered}; {evidence.bound_text()}"
    else:
        text = f"{covered} have loss_mask sum exactly {top_value} — " + (
            "the signature of empty reasoning + a one-word answer such as 'OK.'"
            if top_value < floor
            else "one output shape repeated across the shard"
        )
        text += f"; {evidence.bound_text()}"
    return GateResult("loss_sum_concentration", passed, verdict(passed, text), metadata)


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
        return GateResult("thinking_structure", True, verdict(True, text), {"reasons": False, "rows": len(profile)})
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
        "bad_share": share_of(bad_rows, judged),
        "max_bad_share": max_bad_share,
        **evidence.metadata(),
        **counts,
        "sample_rows": np.flatnonzero(bad)[:SAMPLE].tolist(),
    }
    if not judged:
        text = f"no finished answers to check ({len(profile)} rows, all length-capped or truncated)"
        return GateResult("thinking_structure", True, verdict(True, text), metadata)
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
        text = f"{percent(counts[worst], judged)} of finished answers ({counts[worst]}/{judged}) {described}"
        if len(counts) > 1 and bad_rows > counts[worst]:
            text += f" ({bad_rows} bad in all)"
        text += f"; {evidence.bound_text()}"
    return GateResult("thinking_structure", passed, verdict(passed, text), metadata)


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
    top = Counter({text: len(prompts) for text, prompts in prompts_per_answer.items()}).most_common(SAMPLE)
    metadata: dict[str, Any] = {
        "rows": len(answer_texts),
        "distinct_prompts": distinct_prompts,
        "distinct_answers": len(prompts_per_answer),
        "max_share": max_share,
        "min_repeats": min_repeats,
        "top_answers": [{"answer": text[:200], "distinct_prompts": n} for text, n in top],
    }
    if not top:
        return GateResult("degenerate_answers", True, verdict(True, "no answers to check"), metadata)
    answer, count = top[0]
    evidence = weigh(
        count, distinct_prompts, max_share, false_block_rate=false_block_rate, among_many=True, min_count=min_repeats
    )
    metadata.update(top_answer_prompts=count, top_answer_share=share_of(count, distinct_prompts), **evidence.metadata())
    passed = not evidence.blocks
    shown = repr(answer[:60] + ("…" if len(answer) > 60 else ""))
    covered = f"{percent(count, distinct_prompts)} of distinct prompts ({count}/{distinct_prompts})"
    if passed:
        text = f"the most repeated answer covers {covered}; {evidence.bound_text('distinct prompts')}"
    else:
        text = (
            f"{covered} got the same answer {shown} — one answer for everything, whatever was asked; "
            f"{evidence.bound_text('distinct prompts')}"
        )
    return GateResult("degenerate_answers", passed, verdict(passed, text), metadata)


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
    examples = Counter(text for text in answer_texts if len(text) < min_chars).most_common(SAMPLE)
    empty_evidence = weigh(empty, rows, max_empty_share, false_block_rate=false_block_rate)
    short_evidence = weigh(short, rows, max_short_share, false_block_rate=false_block_rate)
    metadata = {
        "rows": rows,
        "empty_answers": empty,
        "short_answers": short,
        "empty_share": share_of(empty, rows),
        "short_share": share_of(short, rows),
        "min_chars": min_chars,
        "max_short_share": max_short_share,
        "max_empty_share": max_empty_share,
        **empty_evidence.metadata("empty_"),
        **short_evidence.metadata("short_"),
        "common_short_answers": {text: n for text, n in examples},
    }
    if not rows:
        return GateResult("short_answers", True, verdict(True, "no finished answers to check"), metadata)
    if empty_evidence.blocks:
        text = f"{percent(empty, rows)} of finished answers ({empty}/{rows}) are empty after </think>"
        text += f"; {empty_evidence.bound_text('answers')}"
    else:
        text = (
            f"{percent(short, rows)} of finished answers ({short}/{rows}) are shorter than {min_chars} characters"
            + (f", most often {examples[0][0]!r}" if examples else "")
            + f"; {short_evidence.bound_text('answers')}"
        )
    passed = not (empty_evidence.blocks or short_evidence.blocks)
    return GateResult("short_answers", passed, verdict(passed, text), metadata)
