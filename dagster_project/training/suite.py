"""A Great Expectations 1.x suite over one training shard.

GX validates one pandas row per training row: the scalar columns plus figures measured from the token
lists themselves (list lengths, mask sum, mask range), so a count column that disagrees with its lists is
caught. The token-level rules (anchors, vocabulary, thinking structure) live in `gates`, in one numpy
pass; GX would re-scan the lists once per expectation.

The shards of a range run are validated together when they all pass, each on its own otherwise
(`validate_training_frames`): one GX validation costs about the same for 20 rows or 20,000.

GX is imported inside the functions that validate: the import costs seconds and code locations load this
module. Each validation builds an ephemeral context, a registered suite (`context.suites.add`; an
unregistered suite fails `ValidationDefinition.run`) and fresh expectation objects (one object cannot
belong to two suites).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa

from dagster_project.generation_settings import FIT_CUT, GenerationSettings
from dagster_project.records import TRAINING_SCHEMA
from dagster_project.training.lengths import MIN_OUTPUT_TOKENS
from dagster_project.training.row_figures import id_bounds, list_lengths, row_sums

SCALAR_COLUMNS = [
    "event_id",
    "conversation_id",
    "turn_index",
    "shard",
    "num_tokens",
    "num_loss_tokens",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "truncated",
]
FRAME_COLUMNS = [*SCALAR_COLUMNS, "input_ids", "loss_mask"]  # what `training_frame` reads


@dataclass
class SuiteOutcome:
    success: bool
    evaluated: int
    successful: int
    failed: list[str] = field(default_factory=list)  # one line per failed expectation
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def message(self) -> str:
        if self.success:
            return f"ok: all {self.evaluated} expectations met"
        return f"BLOCKED: {len(self.failed)}/{self.evaluated} expectations failed — " + "; ".join(self.failed)


def answer_ends(exclude_length_capped: bool) -> list[str]:
    """How a training row's answer may have ended (`GenerationSettings.answer_end`): finished, or fit-cut where the
    trainer cuts it; cut by max_new_tokens too where length-capped answers are not excluded."""
    return ["stop", FIT_CUT] if exclude_length_capped else ["stop", FIT_CUT, "length"]


def _frame(batch: pa.RecordBatch, settings: GenerationSettings | None) -> pd.DataFrame:
    frame = batch.select(SCALAR_COLUMNS).to_pandas()
    if settings is not None and settings.fit_max_length is not None:  # the answers fit cut, as every gate names them
        ends = zip(frame["prompt_tokens"], frame["completion_tokens"], frame["finish_reason"], strict=True)
        frame["finish_reason"] = [settings.answer_end(int(p), int(c), finish) for p, c, finish in ends]
    mask = batch.column("loss_mask")
    mask_min, mask_max = id_bounds(mask)
    frame["input_len"] = list_lengths(batch.column("input_ids"))
    frame["mask_len"] = list_lengths(mask)
    frame["mask_sum"] = row_sums(mask)
    frame["mask_min"] = mask_min
    frame["mask_max"] = mask_max
    frame["prompt_plus_loss"] = frame["prompt_tokens"].astype("int64") + frame["num_loss_tokens"].astype("int64")
    return frame


def training_frame(batches: Iterable[pa.RecordBatch], settings: GenerationSettings | None = None) -> pd.DataFrame:
    """One row per training row: scalar columns and the figures measured from its lists (lists dropped); its
    `finish_reason` is how the answer ended under the completions' `settings` (`fit_cut` where fit cut it)."""
    # An empty shard still gets every column, so the suite reports failures rather than errors.
    empty = pa.RecordBatch.from_pylist([], schema=TRAINING_SCHEMA)
    frames = [_frame(batch, settings) for batch in batches] or [_frame(empty, settings)]
    return pd.concat(frames, ignore_index=True)


def _expectations(shard: int | None, rows: int | None, max_length: int | None, finish_reasons: list[str]) -> list[Any]:
    """The suite of one shard; with `shard` and `rows` None, the one for the rows of several shards together:
    each row's shard is compared with its `expected_shard` column, and the shards' row counts are compared
    before (a table-level count cannot tell the shards apart)."""
    import great_expectations.expectations as gxe

    return [
        *([] if rows is None else [gxe.ExpectTableRowCountToEqual(value=rows)]),
        gxe.ExpectColumnValuesToNotBeNull(column="event_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="conversation_id"),
        gxe.ExpectColumnValuesToBeUnique(column="event_id"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="shard", column_B="expected_shard")
        if shard is None
        else gxe.ExpectColumnValuesToBeInSet(column="shard", value_set=[shard]),
        gxe.ExpectColumnValuesToBeBetween(column="turn_index", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="num_tokens", min_value=1 + MIN_OUTPUT_TOKENS, max_value=max_length),
        gxe.ExpectColumnValuesToBeBetween(column="num_loss_tokens", min_value=MIN_OUTPUT_TOKENS),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="input_len", column_B="num_tokens"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="mask_len", column_B="num_tokens"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="mask_sum", column_B="num_loss_tokens"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="prompt_plus_loss", column_B="num_tokens"),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="completion_tokens", column_B="num_loss_tokens", or_equal=True
        ),
        gxe.ExpectColumnValuesToBeBetween(column="mask_min", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="mask_max", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeInSet(column="finish_reason", value_set=finish_reasons),
        gxe.ExpectColumnValuesToNotBeNull(column="truncated"),
    ]


def _plain(value: Any) -> Any:
    """numpy scalars (and pairs of them) as plain Python values, so messages read `(4, 9)`."""
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    return value.item() if hasattr(value, "item") else value


def _describe(result: Any) -> str:
    config = result.expectation_config
    kwargs = config.kwargs
    subject = (
        kwargs.get("column") or " vs ".join(filter(None, (kwargs.get("column_A"), kwargs.get("column_B")))) or "table"
    )
    if result.exception_info and result.exception_info.get("raised_exception"):
        return f"{config.type} on {subject} raised: {result.exception_info.get('exception_message')}"
    figures = result.result or {}
    if "unexpected_count" in figures:
        examples = [_plain(value) for value in figures.get("partial_unexpected_list", [])[:3]]
        return f"{config.type} on {subject}: {figures['unexpected_count']} unexpected (e.g. {examples})"
    return f"{config.type} on {subject}: observed {figures.get('observed_value')}"


@dataclass(frozen=True, eq=False)
class ShardFrame:
    """One shard's `training_frame` and what its manifest says the suite should find there."""

    shard: int
    frame: pd.DataFrame
    rows: int
    max_length: int | None
    finish_reasons: list[str]


def validate_training_frame(
    frame: pd.DataFrame, *, shard: int, rows: int, max_length: int | None, finish_reasons: list[str]
) -> SuiteOutcome:
    result = _run(frame, f"training_set_shard_{shard}", _expectations(shard, rows, max_length, finish_reasons))
    return SuiteOutcome(
        success=bool(result.success),
        evaluated=int(result.statistics["evaluated_expectations"]),
        successful=int(result.statistics["successful_expectations"]),
        failed=[_describe(r) for r in result.results if not r.success],
        results=[
            _result(r.expectation_config.type, dict(r.expectation_config.kwargs), r.success) for r in result.results
        ],
    )


def validate_training_frames(shards: Sequence[ShardFrame]) -> dict[int, SuiteOutcome]:
    """Each shard's outcome, as `validate_training_frame` gives it, for the cost of about one validation.

    A GX validation costs ~0.3 CPU-s whatever its row count (context, suite, metric graph per expectation),
    so the shards of a range run are validated together: one frame of all their rows, where every
    expectation is row-level (each row's own shard is a column) or stricter than per shard (event ids unique
    across the shards). Passing together implies each shard passes on its own; when the combined validation
    fails, each of its shards is validated on its own, so a failing shard gets exactly its own verdict and
    message. A shard whose row count differs from its manifest's (an empty one included) is validated alone,
    and shards are combined only with shards of the same settings and column types, so concatenation changes
    nothing a per-shard validation would see. A shard that passed together lists its own expectations in the
    suite's order, under the combined validation's batch id. The step holds its shards' frames (scalar
    columns only, no token lists) at once.
    """
    alone: list[ShardFrame] = []
    groups: dict[tuple[Any, ...], list[ShardFrame]] = {}
    for s in shards:
        if len(s.frame) != s.rows or s.rows == 0:
            alone.append(s)
        else:
            key = (s.max_length, tuple(s.finish_reasons), tuple(s.frame.dtypes.astype(str)))
            groups.setdefault(key, []).append(s)
    outcomes: dict[int, SuiteOutcome] = {}
    for group in groups.values():
        if len(group) > 1 and (batch_id := _passes_together(group)):
            outcomes.update({s.shard: _passed(s, batch_id) for s in group})
        else:
            alone += group
    for s in alone:
        outcomes[s.shard] = validate_training_frame(
            s.frame, shard=s.shard, rows=s.rows, max_length=s.max_length, finish_reasons=s.finish_reasons
        )
    return {s.shard: outcomes[s.shard] for s in shards}


def _passes_together(group: list[ShardFrame]) -> str | None:
    """The batch id of a combined validation of the group's rows when every expectation held, else None."""
    frame = pd.concat([s.frame.assign(expected_shard=s.shard) for s in group], ignore_index=True)
    first = group[0]
    result = _run(
        frame,
        f"training_set_shards_{first.shard}-{group[-1].shard}",
        _expectations(None, None, first.max_length, first.finish_reasons),
    )
    return str(result.results[0].expectation_config.kwargs["batch_id"]) if result.success else None


def _passed(shard: ShardFrame, batch_id: str) -> SuiteOutcome:
    expectations = _expectations(shard.shard, shard.rows, shard.max_length, shard.finish_reasons)
    return SuiteOutcome(
        success=True,
        evaluated=len(expectations),
        successful=len(expectations),
        results=[
            _result(e.configuration.type, {"batch_id": batch_id, **e.configuration.kwargs}, True) for e in expectations
        ],
    )


def _result(expectation: str, kwargs: dict[str, Any], success: bool) -> dict[str, Any]:
    return {"expectation": expectation, "kwargs": kwargs, "success": bool(success)}


def _run(frame: pd.DataFrame, name: str, expectations: list[Any]) -> Any:
    """GX's validation result of the expectations over the frame, in an ephemeral context of its own."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    name = f"{name}_{uuid.uuid4().hex[:8]}"
    batch_definition = (
        context.data_sources.add_pandas(name=name)
        .add_dataframe_asset(name="rows")
        .add_batch_definition_whole_dataframe("all")
    )
    suite = context.suites.add(gx.ExpectationSuite(name=name))
    for expectation in expectations:
        suite.add_expectation(expectation)
    validation = context.validation_definitions.add(
        gx.ValidationDefinition(name=name, data=batch_definition, suite=suite)
    )
    return validation.run(batch_parameters={"dataframe": frame}, result_format="SUMMARY")
