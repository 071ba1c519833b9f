"""Where a completions row's output tokens go when it is assembled: its exclusion reason (first matching wins,
`training.stage`), or, for a kept row, `trained` up to `max_length` and `past_max_length` beyond it. A light module
(no pyarrow): the status reads these names off training manifests."""

from __future__ import annotations

from dagster_project.records import EVAL_CONTAMINATION, PROMPT_FILLS_MAX_LENGTH

ERROR = "error"
ABORTED = "aborted"
UNKNOWN_FINISH_REASON = "unknown_finish_reason"
LENGTH_CAPPED = "length_capped"
EMPTY_OUTPUT = "empty_output"
DUPLICATE_EVENT = "duplicate_event"
OVER_MAX_LENGTH = "over_max_length"
TRAINED = "trained"
PAST_MAX_LENGTH = "past_max_length"

__all__ = [
    "ABORTED",
    "DUPLICATE_EVENT",
    "EMPTY_OUTPUT",
    "ERROR",
    "EVAL_CONTAMINATION",
    "LENGTH_CAPPED",
    "OVER_MAX_LENGTH",
    "PAST_MAX_LENGTH",
    "PROMPT_FILLS_MAX_LENGTH",
    "TRAINED",
    "UNKNOWN_FINISH_REASON",
]
