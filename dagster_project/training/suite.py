"""A Great Expectations 1.x suite over one training shard.

GX validates one pandas row per training row: the scalar columns plus figures measured from the token
lists themselves (list lengths, mask sum, mask range), so a count column that disagrees with its lists is
caught. The token-level rules (anchors, vocabulary, thinking structure) live in `gates`, in one numpy
pass; GX would re-scan the lists once per expectation.

GX is imported inside `validate_training_shard`: the import costs seconds and code locations load this
module. Each validation builds an ephemeral context, a registered suite (`context.suites.add`; an
unregistered suite fails `ValidationDefinition.run`) and fresh expectation objects (one object cannot
belong to two suites).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa

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


def _frame(batch: pa.RecordBatch) -> pd.DataFrame:
    frame = batch.select(SCALAR_COLUMNS).to_pandas()
    mask = batch.column("loss_mask")
    mask_min, mask_max = id_bounds(mask)
    frame["input_len"] = list_lengths(batch.column("input_ids"))
    frame["mask_len"] = list_lengths(mask)
    frame["mask_sum"] = row_sums(mask)
    frame["mask_min"] = mask_min
    frame["mask_max"] = mask_max
    frame["prompt_plus_loss"] = frame["prompt_tokens"].astype("int64") + frame["num_loss_tokens"].astype("int64")
    return frame


def training_frame(batches: Iterable[pa.RecordBatch]) -> pd.DataFrame:
    """One row per training row: scalar columns and the figures measured from its lists (lists dropped)."""
    # An empty shard still gets every column, so the suite reports failures rather than errors.
    frames = [_frame(batch) for batch in batches] or [_frame(pa.RecordBatch.from_pylist([], schema=TRAINING_SCHEMA))]
    return pd.concat(frames, ignore_index=True)


def _expectations(shard: int, rows: int, max_length: int | None, finish_reasons: list[str]) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectTableRowCountToEqual(value=rows),
        gxe.ExpectColumnValuesToNotBeNull(column="event_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="conversation_id"),
        gxe.ExpectColumnValuesToBeUnique(column="event_id"),
        gxe.ExpectColumnValuesToBeInSet(column="shard", value_set=[shard]),
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


def validate_training_frame(
    frame: pd.DataFrame, *, shard: int, rows: int, max_length: int | None, finish_reasons: list[str]
) -> SuiteOutcome:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    name = f"training_set_shard_{shard}_{uuid.uuid4().hex[:8]}"
    batch_definition = (
        context.data_sources.add_pandas(name=name)
        .add_dataframe_asset(name="rows")
        .add_batch_definition_whole_dataframe("all")
    )
    suite = context.suites.add(gx.ExpectationSuite(name=name))
    for expectation in _expectations(shard, rows, max_length, finish_reasons):
        suite.add_expectation(expectation)
    validation = context.validation_definitions.add(
        gx.ValidationDefinition(name=name, data=batch_definition, suite=suite)
    )
    result = validation.run(batch_parameters={"dataframe": frame}, result_format="SUMMARY")
    failed = [_describe(r) for r in result.results if not r.success]
    return SuiteOutcome(
        success=bool(result.success),
        evaluated=int(result.statistics["evaluated_expectations"]),
        successful=int(result.statistics["successful_expectations"]),
        failed=failed,
        results=[
            {
                "expectation": r.expectation_config.type,
                "kwargs": dict(r.expectation_config.kwargs),
                "success": bool(r.success),
            }
            for r in result.results
        ],
    )
