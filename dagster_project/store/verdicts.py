"""What a shard's blocking checks decided, kept next to the shard so that later runs obey it.

Dagster's blocking checks stop downstream assets only in the run that fails them; a later run that selects
the downstream asset alone would go ahead. So each blocking check records its verdict on the shard it judged
(`<stage>/shard=NNNNN/_verdicts/<check>.json`), tied to that publication of the shard by its `published_at`
and `ids_digest`: publishing the shard anew removes the old verdicts (`publish_shard` keeps only what its
manifest lists), and a verdict about another publication is ignored. The next stage reads them before it
uses the shard (`failed_gates`) and refuses a shard that failed a gate, naming it, unless told to override.

A check cannot rewrite the manifest it judges: the manifest's bytes identify the publication that later
stages were built from, and the publishing run may be rewriting it at the same moment.

Each verdict is also copied into the store's index (`object_index`), so `dflash status` reads every shard's
verdicts in a few requests (`read_verdicts`); a copy left by an earlier publication is told apart by `judges`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster_project.store import object_index
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
    put_indexed(store, verdict_key(manifest.stage, manifest.shard, check), to_json(verdict))
    return verdict


def put_indexed(store: Store, key: str, data: bytes) -> None:
    """Write a shard's small JSON record and copy it into the store's index, so readers of every shard's records
    make a few requests."""
    object_index.record(store, key, data, etag=store.put_bytes(key, data).etag)


def read_verdicts(store: Store, stage: str) -> dict[int, list[Verdict]]:
    """Shard → every verdict recorded on the shard, from the store's index (a few requests whatever the shard
    count). Some may judge an earlier publication of the shard: keep those that `judges` its manifest."""
    found = object_index.read_records(store, f"{stage}/shard=", Verdict, lambda key: VERDICTS_DIR in key)
    by_shard: dict[int, list[Verdict]] = {}
    for key, verdict in found.items():
        by_shard.setdefault(shard_of(key), []).append(verdict)
    return by_shard


def shard_of(key: str) -> int:
    """The shard a key under `<stage>/shard=NNNNN/` belongs to."""
    return int(key.split("/shard=", 1)[1].split("/", 1)[0])


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
