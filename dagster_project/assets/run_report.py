from dataclasses import asdict

import dagster as dg

from dagster_project.conversations.shards import published_num_shards
from dagster_project.ops.coverage import dataset_coverage, write_coverage
from dagster_project.ops.status import collect_status, render_text
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet
from dagster_project.store import layout


@dg.asset(
    deps=[layout.COMPLETIONS],
    group_name="report",
    kinds={"duckdb"},
    check_specs=[
        dg.AssetCheckSpec(
            "dataset_exactly_once",
            asset="run_report",
            description="Across all shards, by id: every planned generation event has exactly one record.",
        ),
        dg.AssetCheckSpec(
            "materialized_shards_in_store",
            asset="run_report",
            description="Every completions shard Dagster recorded as materialized has its manifest and intact objects.",
        ),
    ],
    description="The six operator questions (progress, MTP, concurrency, storage, coverage, multi-turn), "
    "computed like `dflash status` from heartbeats, manifests and the live fleet, with coverage by id.",
)
def run_report(
    context: dg.AssetExecutionContext, store: DatasetStore, fleet: SGLangFleet, generation: GenerationConfig
) -> dg.MaterializeResult:
    data = store.open()
    num_shards = published_num_shards(data)
    if num_shards is None:
        raise dg.Failure("conversations are not materialized yet: nothing to report on")
    coverage = dataset_coverage(data, num_shards)
    write_coverage(data, coverage)
    endpoints = fleet.known_endpoints()  # none without a running fleet: the report still answers from the store
    materialized = context.instance.get_materialized_partitions(dg.AssetKey(layout.COMPLETIONS))
    status = collect_status(
        data,
        endpoints,
        api_key=fleet.api_key,
        current_fingerprint=generation.to_dataclass().fingerprint(),
        materialized={layout.shard_index(key) for key in materialized},
    )
    text = render_text(status)
    context.log.info("\n" + text)
    storage = status.storage
    return dg.MaterializeResult(
        metadata={
            "report": dg.MetadataValue.md(f"```\n{text}\n```"),
            "status": dg.MetadataValue.json(asdict(status)),
            "fraction_done": status.progress.fraction_done,
            "events_done": status.progress.events_done,
            "shards_published": storage.shards_published,
            "mtp_on": status.mtp.mtp_on,
            # Question 3 per server: cap, what binds it, the headroom, the flags and the expected gain.
            "capacity": dg.MetadataValue.json(
                {url: asdict(row.capacity) for url, row in status.concurrency.servers.items() if row.capacity}
            ),
            "capacity_headroom": max(
                (row.capacity.headroom for row in status.concurrency.servers.values() if row.capacity), default=1.0
            ),
            "stale_shards": dg.MetadataValue.json(storage.stale_shards),
            "materialized_not_in_store": dg.MetadataValue.json(storage.materialized_not_in_store),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name="dataset_exactly_once",
                # Missing events are expected while shards remain unpublished; duplicates never are.
                passed=coverage.exactly_once
                if coverage.complete
                else not coverage.shards_damaged
                and not coverage.disagreements
                and coverage.events_duplicated + coverage.events_unexpected == 0,
                description=(
                    f"{coverage.events_recorded:,} records for {coverage.events_planned:,} planned events in "
                    f"{coverage.shards_published}/{coverage.shards} published shards: "
                    f"{coverage.events_missing:,} missing, {coverage.events_duplicated:,} duplicated, "
                    f"{coverage.events_unexpected:,} unexpected; damaged shards {coverage.shards_damaged or 'none'}"
                    + "".join(f"; {problem}" for problem in coverage.disagreements)
                ),
                # Lists (the id samples, the damaged shards) as JSON, counts as numbers.
                metadata={
                    name: dg.MetadataValue.json(value) if isinstance(value, list) else value
                    for name, value in asdict(coverage).items()
                },
            ),
            dg.AssetCheckResult(
                check_name="materialized_shards_in_store",
                passed=not storage.materialized_not_in_store,
                description=(
                    f"{len(materialized)} materialized shards; not intact in the store: "
                    f"{storage.materialized_not_in_store or 'none'}"
                ),
                metadata={"materialized": len(materialized), "shards_published": storage.shards_published},
            ),
        ],
    )
