"""What a blocked gate tells the operator beyond its verdict: the threshold that decided it and the run config key
that sets it, the override that lets the shard through anyway, up to five example ids to look at, and the servers
that wrote the rows it failed on (a server of another vocabulary, say, is named).

    examples, servers = example_ids(r, profile, config), writing_servers(r, profile, config)
    results = [actionable(r, limits=config, where=TRAINING_GATES, examples=examples, servers=servers) ...]

The gates themselves (run by `training.gates`) judge; this only completes their messages, so every surface that
shows a gate's message (the check's description, the run's log, the verdict next to the shard, `dflash status`) says
what to do about it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `dflash status` reads the config keys without loading numpy
    import numpy as np

    from dagster_project.training.gate_result import GateResult
    from dagster_project.training.gates import ShardProfile

EXAMPLES = 5

# The run config keys each gate's verdict depends on (the fields of `GateThresholds`, `LengthGateOptions` and
# the completions check's own); a gate not listed has no threshold: any such row or mismatch blocks.
GATE_KEYS: dict[str, tuple[str, ...]] = {
    "loss_sum_floor": ("loss_floor", "max_share_below_floor"),
    "loss_sum_concentration": ("max_top_loss_sum_share", "min_repeats"),
    "consecutive_supervised": ("min_supervised_pairs",),
    "thinking_structure": ("max_bad_thinking_share",),
    "degenerate_answers": ("max_degenerate_share", "min_repeats"),
    "short_answers": ("short_answer_chars", "max_short_answer_share", "max_empty_answer_share"),
    "length_loss": ("max_lost_supervised_share",),
    "malformed_tool_calls": ("max_malformed_tool_call_share",),
    "error_rate": ("max_error_share",),
    "length_capped_rate": ("max_length_capped_share",),
}


@dataclass(frozen=True)
class GateStage:
    """Where a stage's gates are configured and how a shard that failed them is let through anyway."""

    check: str  # the asset check whose run config holds the thresholds
    override: str


COMPLETIONS_GATES = GateStage(
    check="completions_quality",
    override="once the failures are understood, materialize training_set for this shard with run config "
    "override_failed_gates: true",
)
TRAINING_GATES = GateStage(
    check="training_set_gates",
    override="once the failures are understood, materialize specforge_export and hf_export for this shard with run "
    "config override_failed_gates: true",
)


def actionable(
    result: GateResult,
    *,
    limits: Any,
    where: GateStage,
    examples: Sequence[str] = (),
    servers: Mapping[str, int] | None = None,
) -> GateResult:
    """`result` with its threshold and config keys (values read from `limits`, the check's config), the override,
    up to five example ids and the servers that wrote the failing rows (`servers`: rows per server) added to the
    message and the metadata; a passed gate unchanged."""
    if result.passed:
        return result
    keys = GATE_KEYS.get(result.name, ())
    values = {key: getattr(limits, key) for key in keys}
    shown = list(dict.fromkeys(examples))[:EXAMPLES]
    threshold = (
        f"threshold {', '.join(f'{key}={value}' for key, value in values.items())} (run config of the {where.check} "
        "check)"
        if keys
        else "no threshold: any one blocks"
    )
    parts = [result.message, threshold, f"override: {where.override}"]
    if shown:
        parts.append(f"examples: {', '.join(shown)}")
    if servers:
        parts.append(f"written by {describe_servers(servers)}")
    metadata = {
        **result.metadata,
        "thresholds": values,
        "config_check": where.check,
        "override": where.override,
        "example_ids": shown,
        **({"servers": dict(servers)} if servers else {}),
    }
    return replace(result, message="; ".join(parts), metadata=metadata)


def example_ids(result: GateResult, profile: ShardProfile, limits: Any) -> list[str]:
    """Up to five ids of the rows that made `result` fail, in shard order (none for a passed gate, or for one
    judged on figures rather than rows)."""
    if result.passed:
        return []
    if result.name == "ids_match_completions":
        return [event for events in result.metadata.get("samples", {}).values() for event in events][:EXAMPLES]
    rows = _failing_rows(result, profile, limits)
    return [profile.event_ids[i] for i in rows[:EXAMPLES]] if rows is not None else []


def writing_servers(result: GateResult, profile: ShardProfile, limits: Any) -> dict[str, int]:
    """The servers that wrote the rows that made `result` fail, with how many each, most first (empty for a passed
    gate, one judged on figures rather than rows, or rows that name no server)."""
    if result.passed or not profile.servers:
        return {}
    if result.name == "ids_match_completions":
        failing = set(example_ids(result, profile, limits))
        rows = [i for i, event in enumerate(profile.event_ids) if event in failing]
    else:
        found = _failing_rows(result, profile, limits)
        rows = [] if found is None else [int(i) for i in found]
    counts = Counter(profile.servers[i] for i in rows if profile.servers[i])
    return dict(counts.most_common())


def describe_servers(servers: Mapping[str, int]) -> str:
    shown = [f"{url} ({rows:,} rows)" for url, rows in list(servers.items())[:EXAMPLES]]
    more = f" and {len(servers) - EXAMPLES} more" if len(servers) > EXAMPLES else ""
    return f"{len(servers)} server{'s' * (len(servers) != 1)}: {', '.join(shown)}{more}"


def _failing_rows(result: GateResult, profile: ShardProfile, limits: Any) -> np.ndarray | None:
    import numpy as np

    finished = np.asarray(profile.finished, dtype=bool)
    answers = profile.outputs.answer_texts
    meta = result.metadata
    if result.name == "loss_sum_floor":
        return np.flatnonzero(profile.loss_sums < limits.loss_floor)
    if result.name == "loss_sum_concentration" and "top_sum" in meta:
        return np.flatnonzero(profile.loss_sums == meta["top_sum"])
    if result.name == "consecutive_supervised":
        return np.flatnonzero(profile.pairs < limits.min_supervised_pairs)
    if result.name == "ids_in_vocabulary":
        return np.flatnonzero((profile.min_ids < 0) | (profile.max_ids >= meta["vocab_size"]))
    if result.name in ("thinking_structure", "malformed_tool_calls"):
        return np.asarray(meta.get("sample_rows", []), dtype=np.int64)
    if result.name == "degenerate_answers" and meta.get("top_answers"):
        top = meta["top_answers"][0]["answer"]  # cut to 200 characters in the metadata
        return np.flatnonzero(finished & np.array([text[:200] == top for text in answers], dtype=bool))
    if result.name == "short_answers":
        short = np.array([len(text) < limits.short_answer_chars for text in answers], dtype=bool)
        return np.flatnonzero(finished & short)
    return None
