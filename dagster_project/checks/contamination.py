"""Evaluation-set contamination of the conversations: the scan, its report, and what the training set excludes.

Not blocking: with the default action (`quarantine`) the training set excludes the matched conversations'
rows as `eval_contamination`, reading the report this check writes (`reports/contamination.json`); with
`report` they are only listed. The evaluation sets come from the `eval_sets` resource (DFLASH_EVAL_SETS).
"""

# No `from __future__ import annotations`: Dagster 1.13 resolves resource parameters from real annotations.
from dataclasses import asdict

import dagster as dg

from dagster_project.assets.conversations import conversations
from dagster_project.assets.tables import counts_table
from dagster_project.conversations.contamination import REPORT_KEY, scan_conversations, write_report
from dagster_project.resources import DatasetStore, EvalSets

_SAMPLE = 20


@dg.asset_check(
    asset=conversations,
    blocking=False,
    name="eval_contamination",
    description="No user message shares an n-gram with an evaluation set (MT-Bench, HumanEval, GSM8K, or the "
    "user's own files); matches are quarantined from the training set by default.",
)
def eval_contamination(store: DatasetStore, eval_sets: EvalSets) -> dg.AssetCheckResult:
    data = store.open()
    options = eval_sets.to_dataclass()
    report = scan_conversations(data, options)
    write_report(data, report)
    matched = len(report.matches)
    if not options.eval_files:
        text = "no evaluation sets configured (DFLASH_EVAL_SETS): nothing was checked"
    else:
        outcome = "excluded from the training set" if options.action == "quarantine" else "reported only"
        text = (
            f"{matched} of {report.conversations} conversations ({report.messages} user messages) share a "
            f"{options.ngram}-word run with {sum(report.eval_texts.values())} evaluation texts: {outcome}"
        )
    return dg.AssetCheckResult(
        passed=matched == 0,
        severity=dg.AssetCheckSeverity.WARN,
        description=text,
        metadata={
            "message": text,
            "contaminated_conversations": matched,
            "conversations": report.conversations,
            "user_messages": report.messages,
            "action": options.action,
            "ngram": options.ngram,
            "eval_texts": dg.MetadataValue.json(report.eval_texts),
            "eval_grams": report.eval_grams,
            "by_eval_set": dg.MetadataValue.md(counts_table("eval set", report.by("eval_set"))),
            "by_source": dg.MetadataValue.md(counts_table("source", report.by("source"))),
            "sample": dg.MetadataValue.json([asdict(match) for match in report.matches[:_SAMPLE]]),
            "report": dg.MetadataValue.path(data.url(REPORT_KEY)),
        },
    )
