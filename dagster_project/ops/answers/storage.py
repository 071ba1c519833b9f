"""4. Storage: what the manifests say is safely in the store."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.text import ago, as_of, counts_in_line, fmt, shard_list
from dagster_project.store.storage import Store


@dataclass(frozen=True)
class StoreDelay:
    """The store did not answer `dflash status` within its budget: every figure from the store is the node's last
    snapshot's (read at `figures_from`; None: there is none), the servers' figures are read now (`now`)."""

    last_call_s: float  # how long the store's last call took, or had waited when the budget ended
    budget_s: float
    figures_from: float | None
    now: float

    def describe(self) -> str:
        return f"store slow: last call {self.last_call_s:,.0f} s"

    def figures(self) -> str:
        if self.figures_from is None:
            return "no figures from the store: it has not answered a status on this node in time"
        when = f"{as_of(self.figures_from)} ({ago(self.figures_from, self.now)})"
        return f"the figures from the store are as of {when}, not refreshed"


@dataclass(frozen=True)
class TokenizerUse:
    """One tokenizer fingerprint among the published shards: the names it was configured under, and its shards by
    stage. Fingerprint "": shards that did not record theirs (made before tokenizers were recorded)."""

    fingerprint: str
    names: list[str]
    shards: dict[str, list[int]]

    def describe(self) -> str:
        where = "; ".join(f"{stage} {shard_list(shards)}" for stage, shards in self.shards.items())
        if not self.fingerprint:
            return f"unknown (not recorded): {where}"
        return f"{self.fingerprint} ({', '.join(self.names)}): {where}"


def tokenizer_uses(readings: Readings) -> list[TokenizerUse]:
    """The tokenizers the published shards were made under, the unknown last."""
    uses: dict[str, TokenizerUse] = {}
    for stage, by_shard in readings.tokenizers.items():
        for shard, identity in sorted(by_shard.items()):
            use = uses.setdefault(identity.fingerprint, TokenizerUse(identity.fingerprint, [], {}))
            if identity.name and identity.name not in use.names:
                use.names.append(identity.name)
            use.shards.setdefault(stage, []).append(shard)
    return sorted(uses.values(), key=lambda use: (not use.fingerprint, use.fingerprint))


@dataclass(frozen=True)
class StorageAnswer:
    store: str
    shards_total: int
    shards_published: int
    bytes_published: int
    last_publish_at: float | None
    unpublished_shards: list[int]  # the first 50
    failed_uploads: int
    # Shards published under different generation settings would mix in one training set.
    settings_fingerprints: dict[str, int]
    stale_shards: list[int]
    shards_materialized: int | None
    # Dagster says materialized, the store disagrees: no manifest, or the last coverage check found the shard's
    # objects missing or altered.
    materialized_not_in_store: list[int] | None
    delay: StoreDelay | None = None  # the store too slow to answer status: its figures are not refreshed
    # The shard runs' store calls and those retried, by cause (S3 `SlowDown`, timeouts): nothing lost, time spent.
    store_calls: int = 0
    store_retries: dict[str, int] = field(default_factory=dict)
    # The tokenizers the published shards were made under: more than one known fingerprint mixes renderings.
    tokenizers: list[TokenizerUse] = field(default_factory=list)
    # Stage → shards made from conversations edited since (`Readings.made_from_edited_conversations`).
    made_from_edited_conversations: dict[str, list[int]] = field(default_factory=dict)

    @property
    def tokenizers_mixed(self) -> bool:
        return sum(1 for use in self.tokenizers if use.fingerprint) > 1


def answer_storage(
    store: Store,
    readings: Readings,
    current_fingerprint: str | None,
    materialized: set[int] | None,
    delay: StoreDelay | None = None,
) -> StorageAnswer:
    """What the manifests say is safely in the store."""
    published, damaged = readings.published, readings.damaged_objects
    return StorageAnswer(
        store=store.uri,
        shards_total=readings.num_shards,
        shards_published=len(published),
        bytes_published=sum(m.stored_bytes for m in published.values()),
        last_publish_at=max((m.published_at for m in published.values()), default=None),
        unpublished_shards=[s for s in range(readings.num_shards) if s not in published][:50],
        failed_uploads=sum(b.upload_failures for b in readings.heartbeats),
        store_calls=sum(b.store_calls for b in readings.heartbeats),
        store_retries=dict(sum((Counter(b.store_retries) for b in readings.heartbeats), Counter())),
        settings_fingerprints=dict(Counter(m.settings_fingerprint for m in published.values())),
        stale_shards=sorted(
            s for s, m in published.items() if current_fingerprint and m.settings_fingerprint != current_fingerprint
        ),
        shards_materialized=len(materialized) if materialized is not None else None,
        materialized_not_in_store=None
        if materialized is None
        else sorted(s for s in materialized if s not in published or s in damaged),
        delay=delay,
        tokenizers=tokenizer_uses(readings),
        made_from_edited_conversations=readings.made_from_edited_conversations,
    )


def retried_calls(storage: StorageAnswer) -> str:
    """ "store calls retried by the shard runs: SlowDown 120, ReadTimeoutError 3 of 4,000 (3.1%)"."""
    retried = sum(storage.store_retries.values())
    causes = ", ".join(f"{cause} {count:,}" for cause, count in sorted(storage.store_retries.items()))
    share = retried / storage.store_calls if storage.store_calls else 0.0
    return f"store calls retried by the shard runs: {causes} of {storage.store_calls:,} ({share:.1%}); none lost"


def render_storage(storage: StorageAnswer, now: float) -> list[str]:
    s = storage
    lines = [
        "4. Storage",
        f"   {s.store}: {s.shards_published}/{s.shards_total} shards published "
        f"(Dagster: {fmt(s.shards_materialized)} materialized), {fmt(s.bytes_published)} bytes, "
        f"failed uploads {s.failed_uploads}, last publish {ago(s.last_publish_at, now)}",
        f"   generation settings of published shards: {counts_in_line(s.settings_fingerprints) or '—'}"
        + ("  ALERT: mixed settings" if len(s.settings_fingerprints) > 1 else "")
        + (f"  stale (made with other settings than configured now): {s.stale_shards}" if s.stale_shards else ""),
    ]
    lines += [
        "   tokenizers of published shards: "
        + (" | ".join(use.describe() for use in s.tokenizers) or "—")
        + ("  ALERT: mixed tokenizers" if s.tokenizers_mixed else ""),
        *(
            f"   ALERT: {stage} shards made from conversations edited since: {shard_list(shards)}"
            for stage, shards in s.made_from_edited_conversations.items()
        ),
    ]
    if s.store_retries:
        lines.append(f"   {retried_calls(s)}")
    if s.delay:
        lines.insert(
            1,
            f"   {s.delay.describe()} (no answer within status's budget of {s.delay.budget_s:g} s, "
            f"DFLASH_STATUS_BUDGET_S): {s.delay.figures()}",
        )
    if s.materialized_not_in_store:
        lines.append(f"   ALERT: materialized in Dagster but not intact in the store: {s.materialized_not_in_store}")
    return lines
