"""What a shard's blocking checks decided, kept next to the shard so that later runs obey it.

Dagster's blocking checks stop downstream assets only in the run that fails them; a later run that selects
the downstream asset alone would go ahead. So each blocking check records its verdict on the shard it judged
(`<stage>/shard=NNNNN/_verdicts/<check>.json`), tied to that publication of the shard by its `published_at`
and `ids_digest`: publishing the shard anew removes the old verdicts (`publish_shard` keeps only what its
manifest lists), and a verdict about another publication is ignored. The next stage reads them before it
uses the shard (`failed_gates`) and refuses a shard that failed a gate, naming it, unless told to override.

A check cannot rewrite the manifest it judges: the manifest's bytes identify the publication that later
stages were built from, and the publishing run may be rewriting it at the same moment.

The export records what it did the same way (`ExportOutcome`, `training_set/shard=NNNNN/_exports/specforge.json`):
exported, with the failed gates it overrode, or refused and why.

Each verdict and outcome is also copied into the store's index (`object_index`), so `dflash status` reads every shard's
verdicts in a few requests (`read_stage_records`); a copy left by an earlier publication is told apart by `judges`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from dagster_project.store import object_index
from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.layout import MANIFEST_NAME, TRAINING_SET, shard_prefix
from dagster_project.store.manifest import ShardManifest
from dagster_project.store.storage import Store
from dagster_project.store.transfer import map_in_order

ManifestT = TypeVar("ManifestT", bound=ShardManifest)

VERDICTS_DIR = "_verdicts/"
# The checks whose passing verdicts a training shard needs before it is exported (`training.export`).
REQUIRED_VERDICTS = ("gates", "gx_suite")
EXPORTS_DIR = "_exports/"
SPECFORGE = "specforge"


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
    return record_verdicts(store, [manifest], check, failures)[0]


def record_verdicts(
    store: Store, manifests: Iterable[ShardManifest], check: str, failures: dict[str, str]
) -> list[Verdict]:
    """`record_verdict` on many shards at once (a check that judges a whole stage): the verdicts are written side by
    side on S3 (each a PUT and its verifying HEAD), then copied into the index with one update per index block, not
    one per shard (1,830 of them each rewriting a 128-shard block were most of a stage check's time)."""

    def write(manifest: ShardManifest) -> tuple[str, bytes, str | None, Verdict]:
        verdict = Verdict(check, not failures, dict(failures), manifest.published_at, manifest.ids_digest)
        key, data = verdict_key(manifest.stage, manifest.shard, check), to_json(verdict)
        return key, data, store.put_bytes(key, data).etag, verdict

    written = list(map_in_order(store, write, manifests))
    object_index.record_all(store, {key: (data, etag) for key, data, etag, _ in written})
    return [verdict for *_, verdict in written]


def put_indexed(store: Store, key: str, data: bytes) -> None:
    """Write a shard's small JSON record and copy it into the store's index, so readers of every shard's records
    make a few requests."""
    object_index.record(store, key, data, etag=store.put_bytes(key, data).etag)


@dataclass(frozen=True)
class StageRecords(Generic[ManifestT]):
    """What a stage records about its shards, by shard: the published manifests, the checks' verdicts (some may
    judge an earlier publication of the shard: keep those that `judges` its manifest) and, for the training set,
    the export's outcomes."""

    manifests: dict[int, ManifestT]
    verdicts: dict[int, list[Verdict]]
    exports: dict[int, ExportOutcome]


def read_stage_records(store: Store, stage: str, kind: type[ManifestT]) -> StageRecords[ManifestT]:
    """Every shard's records of `stage`, from one read of the store's index (a few requests whatever the shard
    count)."""
    prefix = f"{stage}/shard="
    entries = object_index.read_index(store, stage)
    manifests = object_index.records_from(store, entries, prefix, kind, lambda key: key.endswith(MANIFEST_NAME))
    verdicts = object_index.records_from(store, entries, prefix, Verdict, lambda key: VERDICTS_DIR in key)
    exports = object_index.records_from(
        store, entries, prefix, ExportOutcome, lambda key: key.endswith(f"{EXPORTS_DIR}{SPECFORGE}.json")
    )
    by_shard: dict[int, list[Verdict]] = {}
    for key, verdict in verdicts.items():
        by_shard.setdefault(shard_of_key(stage, key), []).append(verdict)
    return StageRecords(
        {manifest.shard: manifest for manifest in manifests.values()},
        by_shard,
        {shard_of_key(stage, key): outcome for key, outcome in exports.items()},
    )


def shard_of_key(stage: str, key: str) -> int:
    """The shard a key under `<stage>/shard=NNNNN/` belongs to."""
    start = len(stage) + len("/shard=")
    return int(key[start : key.index("/", start)])


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


@dataclass(frozen=True)
class ExportOutcome:
    """What the last export of one publication of a training shard did (`published_at` and `ids_digest` tell
    which): `exported`, with the failed gates it overrode, or not, with the reason it was `refused`."""

    exporter: str
    exported: bool
    at: float
    published_at: float
    ids_digest: str
    key: str = ""  # the exported object
    overridden: dict[str, str] = field(default_factory=dict)  # `check/gate` → message
    refused: str = ""
    damaged: bool = False  # refused because the training shard's objects are not as published (`refused` names them)

    def judges(self, manifest: ShardManifest) -> bool:
        return (self.published_at, self.ids_digest) == (manifest.published_at, manifest.ids_digest)


def export_outcome_key(shard: int, exporter: str = SPECFORGE) -> str:
    return f"{shard_prefix(TRAINING_SET, shard)}{EXPORTS_DIR}{exporter}.json"


def record_export_outcome(
    store: Store,
    manifest: ShardManifest,
    *,
    key: str = "",
    overridden: dict[str, str],
    refused: str = "",
    damaged: bool = False,
) -> None:
    """Record what the SpecForge export did with this publication of the training shard."""
    outcome = ExportOutcome(
        SPECFORGE,
        not refused,
        time.time(),
        manifest.published_at,
        manifest.ids_digest,
        key,
        overridden,
        refused,
        damaged,
    )
    put_indexed(store, export_outcome_key(manifest.shard), to_json(outcome))
