"""The completions gates that judge a share of events (errors, answers cut at `max_new_tokens`) and the accept
length's floor: one definition for the `completions_quality` check and the live quality watch alike."""

from __future__ import annotations

from dagster_project.training.gates import GateResult

SPEC_ACCEPT_LENGTH_FLOOR = 1.5
MAX_ERROR_SHARE = 0.02
MAX_LENGTH_CAPPED_SHARE = 0.10


def share_gate(name: str, count: int, total: int, max_share: float, what: str, by_kind: dict) -> GateResult:
    """Passed while `count` of `total` events is at most `max_share`; `by_kind` breaks the count down."""
    share = count / total if total else 0.0
    passed = share <= max_share
    verdict = "ok" if passed else "BLOCKED"
    return GateResult(
        name,
        passed,
        f"{verdict}: {share:.1%} of events ({count}/{total}) {what} (limit {max_share:.0%})"
        + (f"; by kind {by_kind}" if by_kind else ""),
        {"count": count, "events": total, "share": share, "max_share": max_share, "by_kind": by_kind},
    )
