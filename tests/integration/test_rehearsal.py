"""A shortened dress rehearsal: one backfill of the shard job's assets on PostgreSQL and S3, the sensors on.

The harness is benchmarks/bench_rehearsal.py's (`rehearse`), without the browser, Prometheus and the ideal's
dispatcher (the benchmark measures those): the instance of deploy/dagster-postgres.yaml on the session's PostgreSQL
server, the store on the session's moto server, `dagster dev` with the project's sensors running as they ship, one
`launchPartitionBackfill` over every partition as the UI sends it. 24 partitions, in runs of 12 shards
(`DFLASH_SHARDS_PER_RUN`; its default, 64, would make one run of them, leaving the pool and the queue nothing to
order): about 200 CPU-s in all (measured by the benchmark at 24 partitions); 120 partitions would take ~5
CPU-minutes, more than `make test` can give one test. The full size is `make rehearsal`'s.

It asserts the job's invariants, read back from PostgreSQL and the store: the backfill finishes and succeeds;
coverage by id is exact (`dflash status --by-id`); every partition of every shard asset is materialized exactly
once; no pool slot is held after the end; every run launched (the backfill's, the sensors') materialized
something.
"""

from __future__ import annotations

import pytest

from benchmarks.bench_rehearsal import Settings, rehearse

PARTITIONS = 24
SHARDS_PER_RUN = 12  # two runs
BACKFILL_TIMEOUT_S = 600  # a bound for a stuck backfill, far above its time on a loaded machine


@pytest.mark.timeout(BACKFILL_TIMEOUT_S + 300)  # the backfill's bound, and dagster dev's start and the recount
def test_one_backfill_over_every_partition_keeps_every_invariant(postgres_server, s3_server, tmp_path):
    settings = Settings(
        shards=PARTITIONS,
        shards_per_run=SHARDS_PER_RUN,
        timeout_s=BACKFILL_TIMEOUT_S,
        browser=False,
        prometheus=False,
        ideal=False,
    )
    result = rehearse(settings, tmp_path, postgres_server, s3_server)

    assert result.finished, f"the backfill did not end within {BACKFILL_TIMEOUT_S} s ({result.backfill_status})"
    assert result.backfill_status == "COMPLETED_SUCCESS", (result.backfill_status, result.failures)
    assert {run.status for run in result.runs} == {"SUCCESS"}, result.failures
    assert len(result.backfill_runs) > 1  # the pool and the queue had runs to order
    assert result.coverage.exactly_once, result.coverage
    assert result.coverage.events_planned == result.events
    assert result.partitions_materialized_once() == {asset: [] for asset in result.materialized}
    assert result.leaked_slots == []
    assert result.runs_without_work == [], result.runs_without_work
    assert set(result.sensors.values()) == {"RUNNING"}, result.sensors
