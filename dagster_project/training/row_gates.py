"""The row gates: every row of a shard must pass them, one failing row is enough to block. Over the row figures
(`training.row_figures`): `consecutive_supervised` (an anchor for DFlash), `ids_in_vocabulary`; over the lengths the
trainer keeps (`training.lengths`): `length_loss`; and each training row against the completions it was assembled from:
`ids_match_completions`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from dagster_project.training.gate_result import SAMPLE, GateResult, verdict
from dagster_project.training.lengths import LengthFigures
from dagster_project.training.row_figures import ids_digest, list_buffers

MIN_SUPERVISED_PAIRS = 1


def consecutive_supervised(pair_counts: np.ndarray, *, min_pairs: int = MIN_SUPERVISED_PAIRS) -> GateResult:
    """Every row needs two consecutive supervised tokens: without one DFlash has no anchor to train on."""
    pairs = np.asarray(pair_counts)
    rows, short = int(pairs.size), int((pairs < min_pairs).sum())
    metadata = {
        "rows": rows,
        "min_pairs": min_pairs,
        "rows_without_enough_pairs": short,
        "min_pairs_in_a_row": int(pairs.min()) if rows else 0,
        "sample_rows": np.flatnonzero(pairs < min_pairs)[:SAMPLE].tolist(),
    }
    passed = short == 0
    text = (
        f"every row has at least {min_pairs} pair(s) of consecutive supervised tokens"
        if passed
        else f"{short}/{rows} rows have fewer than {min_pairs} pair(s) of consecutive supervised tokens "
        "— DFlash cannot place an anchor in them"
    )
    return GateResult("consecutive_supervised", passed, verdict(passed, text), metadata)


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
        "sample_rows": np.flatnonzero(bad)[:SAMPLE].tolist(),
    }
    passed = bad_rows == 0
    text = (
        f"all ids lie in [0, {vocab_size}) (largest {metadata['max_id']})"
        if passed
        else f"{bad_rows}/{rows} rows hold ids outside [0, {vocab_size}) (smallest {metadata['min_id']}, "
        f"largest {metadata['max_id']}) — wrong tokenizer or corrupted rows"
    )
    return GateResult("ids_in_vocabulary", passed, verdict(passed, text), metadata)


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
    return GateResult("length_loss", passed, verdict(passed, text), metadata)


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
        "samples": {name: events[:SAMPLE] for name, events in problems.items() if events},
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
    return GateResult("ids_match_completions", passed, verdict(passed, text), metadata)
