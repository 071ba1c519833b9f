"""The evaluation sets prompts are checked against, and what a match does (`conversations.contamination`)."""

# No `from __future__ import annotations`: Dagster 1.13 cannot resolve string annotations of a resource.
import dagster as dg

from dagster_project.conversations.contamination import ContaminationOptions
from dagster_project.resources.config_fields import config_fields


class EvalSets(config_fields(ContaminationOptions, dg.ConfigurableResource)):
    """Evaluation-set files (DFLASH_EVAL_SETS), the n-gram length and the action on a match."""
