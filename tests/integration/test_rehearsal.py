"""A shortened dress rehearsal: one backfill of the shard job over 120 partitions on PostgreSQL and S3, sensors on.

The harness is benchmarks/bench_rehearsal.py's (`rehearse`), at 120 partitions of a few events each, without the
browser, Prometheus and the ideal's dispatcher (the benchmark measures those): the instance of
deploy/dagster-postgres.yaml on the session's PostgreSQL server, the store on the session's moto server,
`dagster dev` with the project's sensors running as they ship, one `launchPartitionBackfill` as the UI sends it.

It asserts the job's invariants, read back from PostgreSQL and the store: the backfill finishes and succeeds;
coverage by id is exact (`dflash status --by-id`); every partition of every shard asset is materialized exactly
once; no pool slot is held after the end; every run launched (the backfill's, the sensors') materialized
something.
"""

from __future__ import annotations

from benchmarks.bench_rehearsal import Settings, rehearse

PARTITIONS = 120
TIMEOUT_S = 900  # a bound for a stuck backfill, far above its time on a loaded machine


def test_a_backfill_over_120_partitions_keeps_every_invariant(postgres_server, s3_server, tmp_path):
    settings = Settings(shards=PARTITIONS, timeout_s=TIMEOUT_S, browser=False, prometheus=False, ideal=False)
    result = rehearse(settings, tmp_path, postgres_server, s3_server)

    assert result.finished, f"the backfill did not end within {TIMEOUT_S} s ({result.backfill_status})"
    assert result.backfill_status == "COMPLETED_SUCCESS", result.backfill_status
    assert {run.status for run in result.runs} == {"SUCCESS"}, [(r.run_id, r.status) for r in result.runs]
    assert result.coverage.exactly_once, result.coverage
    assert result.coverage.events_planned == result.events
    assert result.partitions_materialized_once() == {asset: [] for asset in result.materialized}
    assert result.leaked_slots == []
    assert result.runs_without_work == []
    assert set(result.sensors.values()) == {"RUNNING"}, result.sensors
