"""The `malformed_tool_calls` gate: of the tool calls the model wrote in a shard's finished answers, the share that
do not follow the Qwen3.6 format (`dagster_project.tool_calls`). A malformed call trains the drafter on text the
server's tool parser rejects; a few are the model's own noise, many mean a broken template or parser setting.

Only that format is read, so the gate judges a model whose chat template writes calls in it
(`TokenizerProfile.tool_calls_known`: Qwen3.6). Another model's calls (Qwen3's JSON, DeepSeek's
`<｜tool▁call▁begin｜>`, Mistral's `[TOOL_CALLS]`) are not judged: the gate passes saying so, with the finished
answers it did not read counted (`not_judged_answers`), never a false alarm on a form it cannot read.

Judged on the answer texts `training.output_profile.profile_outputs` already decoded, so it costs one regex pass per
answer that holds `<tool_call>`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dagster_project.tool_calls import OPEN, parse_tool_calls
from dagster_project.training.evidence import FALSE_BLOCK_RATE, weigh
from dagster_project.training.gate_result import GateResult

MAX_MALFORMED_TOOL_CALL_SHARE = 0.05
_SAMPLE = 5


@dataclass(frozen=True)
class ToolCallGateOptions:
    """The threshold of the `malformed_tool_calls` gate on training shards."""

    max_malformed_tool_call_share: float = field(
        default=MAX_MALFORMED_TOOL_CALL_SHARE,
        metadata={"help": "Largest share of generated tool calls (in finished answers) that may be malformed."},
    )


def malformed_tool_calls(
    answer_texts: Sequence[str],
    finished: np.ndarray,
    *,
    calls_known: bool = True,
    max_share: float = MAX_MALFORMED_TOOL_CALL_SHARE,
    false_block_rate: float = FALSE_BLOCK_RATE,
) -> GateResult:
    """Blocks on evidence that more than `max_share` of the generated calls in finished answers are malformed
    (`training.evidence`); `calls_known`: the model's template writes calls in the form read here (else not
    judged)."""
    if not calls_known:
        answers = int(np.asarray(finished, dtype=bool).sum())
        text = (
            f"not judged: the model's chat template writes tool calls in another form than Qwen3.6's <tool_call>, "
            f"the only one this gate reads ({answers} finished answers not read)"
        )
        metadata = {"calls_known": False, "not_judged_answers": answers, "max_malformed_share": max_share}
        return GateResult("malformed_tool_calls", True, f"ok: {text}", metadata)
    calls = malformed = 0
    bad_rows: list[int] = []
    for row, (text, keep) in enumerate(zip(answer_texts, np.asarray(finished, dtype=bool), strict=True)):
        if not keep or OPEN not in text:
            continue
        parsed = parse_tool_calls(text)
        calls += parsed.total
        malformed += parsed.malformed
        if parsed.malformed:
            bad_rows.append(row)
    evidence = weigh(malformed, calls, max_share, false_block_rate=false_block_rate)
    passed = not evidence.blocks
    metadata = {
        "tool_calls": calls,
        "malformed_tool_calls": malformed,
        "malformed_share": evidence.share,
        "max_malformed_share": max_share,
        **evidence.metadata(),
        "sample_rows": bad_rows[:_SAMPLE],
    }
    if not calls:
        return GateResult("malformed_tool_calls", True, "ok: no tool calls in finished answers", metadata)
    text = f"{malformed}/{calls} generated tool calls malformed ({evidence.share:.1%}); {evidence.bound_text('calls')}"
    return GateResult("malformed_tool_calls", passed, f"{'ok' if passed else 'BLOCKED'}: {text}", metadata)
