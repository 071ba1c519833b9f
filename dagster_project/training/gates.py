"""Quality gates on generated answers and training rows: the checks that would have caught "loss_mask sum = 6".

The last attempt at this dataset shipped 914K rows of which 87% had a loss_mask sum of exactly 6: empty
reasoning plus "OK." as the answer. Every gate below looks at one shard and returns a `GateResult`: `passed`,
one line a person understands at a glance, and every figure behind it.

Two layers, both plain numpy over Arrow list columns, one chunk at a time:

* **per-row figures** — `list_lengths`, `row_sums`, `supervised_pairs`, `id_bounds`, `row_digests`,
  `split_by_mask` (in `training.row_figures`), and `profile_outputs` (in `training.output_profile`: thinking
  structure and answer text of generated outputs);
* **gates over those figures** — the share gates, which weigh how many rows or answers show a sign against the
  largest share a healthy shard may have (`training.distribution_gates`: `loss_sum_floor`,
  `loss_sum_concentration`, `thinking_structure`, `degenerate_answers`, `short_answers`), and the row gates, which
  every row must pass (`training.row_gates`: `consecutive_supervised`, `ids_in_vocabulary`, `length_loss`,
  `ids_match_completions`); `malformed_tool_calls` (the model's own tool calls) lives beside them in
  `training.tool_call_gate`. Each returns a `training.gate_result.GateResult`.

This module gathers a shard's figures in one pass (`ShardProfile`) and runs its gates (`shard_gates`) by their
thresholds (`GateThresholds`).

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
  break the Qwen3.6 `<tool_call>` format (judged only for a model whose template writes calls in that form).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dagster_project.training.distribution_gates import (
    LOSS_FLOOR,
    MAX_BAD_THINKING_SHARE,
    MAX_DEGENERATE_SHARE,
    MAX_EMPTY_ANSWER_SHARE,
    MAX_SHARE_BELOW_FLOOR,
    MAX_SHORT_ANSWER_SHARE,
    MAX_TOP_LOSS_SUM_SHARE,
    MIN_REPEATS,
    SHORT_ANSWER_CHARS,
    degenerate_answers,
    loss_sum_concentration,
    loss_sum_floor,
    short_answers,
    thinking_structure,
)
from dagster_project.training.evidence import FALSE_BLOCK_RATE
from dagster_project.training.gate_result import GateResult
from dagster_project.training.output_profile import Decode, OutputProfile, profile_outputs
from dagster_project.training.row_figures import (
    adjacent_per_row,
    id_bounds,
    list_lengths,
    row_digests,
    row_sums,
    split_by_mask,
    supervised_pairs,
)
from dagster_project.training.row_gates import (
    MIN_SUPERVISED_PAIRS,
    RowDigest,
    consecutive_supervised,
    ids_in_vocabulary,
)

if TYPE_CHECKING:
    from dagster_project.tokenizer import SpecialIds


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
