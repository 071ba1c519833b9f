"""What a shard's blocking checks decided, kept next to the shard so that later runs obey it.

Dagster's blocking checks stop downstream assets only in the run that fails them; a later run that selects
the downstream asset alone would go ahead. So each blocking check records its verdict on the shard it judged
(`<stage>/shard=NNNNN/_verdicts/<check>.json`), tied to that publication of the shard by its `published_at`
and `ids_digest`: publishing the shard anew removes the old verdicts (`publish_shard` keeps only what its
manifest lists), and a verdict about another publication is ignored. The next stage reads them before it
uses the shard (`failed_gates`) and refuses a shard that failed a gate, naming it, unless told to override.

A check cannot rewrite the manifest it judges: the manifest's bytes identify the publication that later
stages were built from, and the publishing run may be rewriting it at the same moment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.layout import shard_prefix
from dagster_project.store.manifest import ShardManifest
from dagster_project.store.storage import Store

VERDICTS_DIR = "_verdicts/"


@dataclass(frozen=True)
class Verdict:
    """A check's outcome on one publication of a shard (`published_at` and `ids_digest` tell which)."""

    check: str
    passed: bool
    failures: dict[str, str] = field(default_factory=dict)  # gate → its message
    published_at: float = 0.0
    ids_digest: str = ""

    def judges(self, manifest: ShardManifest) -> bool:
        return (self.published_at, self.ids_digest) == (manifest.published_at, manifest.ids_digest)


def verdict_key(stage: str, shard: int, check: str) -> str:
    return f"{shard_prefix(stage, shard)}{VERDICTS_DIR}{check}.json"


def record_verdict(store: Store, manifest: ShardManifest, check: str, failures: dict[str, str]) -> Verdict:
    """Record a check's outcome on this publication of the shard; `failures` maps a failed gate to its message."""
    verdict = Verdict(check, not failures, dict(failures), manifest.published_at, manifest.ids_digest)
    store.put_bytes(verdict_key(manifest.stage, manifest.shard, check), to_json(verdict))
    return verdict


def read_verdict(store: Store, manifest: ShardManifest, check: str) -> Verdict | None:
    """The check's verdict on this publication of the shard; None if it has not judged this one."""
    verdict = read_record(store, verdict_key(manifest.stage, manifest.shard, check), Verdict)
    return verdict if verdict is not None and verdict.judges(manifest) else None


def failed_gates(store: Store, manifest: ShardManifest) -> dict[str, str]:
    """Every gate a check failed on this publication of the shard, as `check/gate` → its message."""
    failed = {}
    prefix = shard_prefix(manifest.stage, manifest.shard) + VERDICTS_DIR
    for info in sorted(store.list(prefix), key=lambda info: info.key):
        if not info.key.endswith(".json"):
            continue
        verdict = read_verdict(store, manifest, info.key[len(prefix) : -len(".json")])
        if verdict is not None and not verdict.passed:
            failed.update({f"{verdict.check}/{gate}": message for gate, message in verdict.failures.items()})
    return failed


def describe_failures(failures: dict[str, str]) -> str:
    return "; ".join(f"{gate}: {message}" for gate, message in failures.items())
