"""Benchmark: `dflash status` and coverage by id at the real job's scale, on a local store and on S3.

    python -m benchmarks.bench_status_scale [--events 913786] [--shards 1830] [--no-s3] [--no-local]

Builds a store with the project's own writers (conversations through `ShardBuffers` and `publish_shards`,
completions Parquet published with `publish_shard`, each shard run's last heartbeat through `write_heartbeat`),
with one-line answers so it stays small, and caches it under `--work-dir` so reruns skip the build. The S3 store,
on a moto server on loopback (`tests/support/s3_server.py`) started for each run, is that store copied as
publishing there would have left it (`copy_store`: every object through the store's own writes, many at a time,
manifests recording each object's ETag, the index rebuilt from the objects). Measured on each:

* **status**: `dflash status` in this process (`cli.main(["status"])`, output discarded: imports and interpreter
  start are not counted), without `DAGSTER_HOME` and with one whose instance has every completions shard
  materialized; next to it the simple alternative, one request per manifest and per heartbeat (a listing then
  16 concurrent GETs);
* **coverage by id**: `dataset_coverage` (reads every manifest, verifies every stored object, loads the ids
  with DuckDB, joins), next to bare DuckDB answering the same three counts (missing, duplicated, unexpected)
  from the same objects in one query: by glob on the local store, and through the same pyarrow S3 file system
  on S3 (this machine has no DuckDB httpfs extension).

Writes its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import duckdb
import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from benchmarks.report import write_section
from dagster_project import cli
from dagster_project.conversations.sharding import shard_of
from dagster_project.conversations.shards import (
    ShardBuffers,
    publish_shards,
    read_conversations_manifest,
)
from dagster_project.generation.heartbeat import ACTIVE_STATES, HEARTBEATS_PREFIX, write_heartbeat
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.ops.coverage import dataset_coverage
from dagster_project.ops.status import collect_status
from dagster_project.records import COMPLETION_SCHEMA, Conversation
from dagster_project.store import layout, object_index
from dagster_project.store.layout import MANIFEST_NAME
from dagster_project.store.manifest import StoredObject, ids_digest, publish_shard, write_stage_manifest
from dagster_project.store.storage import S3_WORKERS, LocalStore, S3Store, Store
from dagster_project.store.transfer import arrow_filesystem
from dagster_project.tokenizer import TokenizerIdentity
from tests.support.stage_manifests import conversations_manifest

REAL_EVENTS, REAL_SHARDS = 913_786, 1_830
PUBLISH_WORKERS = 8
BUCKET = "bench-status"
BUILD_COMPLETE = "_bench_complete"


def conversations(events: int) -> Iterator[Conversation]:
    """`events` generated turns: one conversation in ten asks two questions (two generated turns)."""
    number = made = 0
    while made < events:
        turns = 2 if number % 10 == 0 and events - made >= 2 else 1
        messages = []
        for turn in range(turns):
            messages += [{"role": "user", "content": f"Question {number}.{turn}?"}]
            if turn < turns - 1:
                messages += [{"role": "assistant", "content": "Yes."}]
        yield Conversation(
            id=f"c{number:07d}", messages=messages, generate_after=[2 * t for t in range(turns)], source="bench"
        )
        made += turns
        number += 1


def completions_table(shard: int, items: list[Conversation]) -> pa.Table:
    rows = [
        {
            **{name: None for name in COMPLETION_SCHEMA.names},
            "event_id": c.event_id(t),
            "conversation_id": c.id,
            "turn_index": t,
            "num_turns": c.num_turns,
            "policy": c.policy,
            "shard": shard,
            "status": "ok",
            "text": "Yes.",
            "output_ids": [9454, 13],
            "completion_tokens": 2,
            "prompt_tokens": 12,
        }
        for c in items
        for t in range(c.num_turns)
    ]
    return pa.Table.from_pylist(rows, schema=COMPLETION_SCHEMA)


def build_store(store: Store, events: int, num_shards: int, work: Path) -> None:
    """Conversations, completions and the last heartbeats of `num_shards` shard runs, written as the stages do."""
    buffers = ShardBuffers(work / "buffers", num_shards)
    by_shard: dict[int, list[Conversation]] = {s: [] for s in range(num_shards)}
    multi = rows = 0
    for conversation in conversations(events):
        conversation.shard = shard_of(conversation.id, num_shards)
        buffers.write(conversation, conversation.to_json())
        by_shard[conversation.shard].append(conversation)
        multi += conversation.num_turns > 1
        rows += 1
    buffers.flush()
    shard_manifests = publish_shards(
        store, buffers, policy="all_turns", build_id="bench", tokenizer=TokenizerIdentity()
    )
    write_stage_manifest(
        store,
        conversations_manifest(num_shards=num_shards, rows=rows, turns=events, multi_turn=multi, build_id="bench"),
    )
    now = time.time()

    def publish(shard: int) -> None:
        items = by_shard[shard]
        table = completions_table(shard, items)
        path = work / f"completions-{shard}.parquet"
        pq.write_table(table, path, compression="zstd")
        heartbeat = Heartbeat(
            shard=shard,
            state="published",
            settings_fingerprint="bench",
            started_at=now - 3600 + shard,
            updated_at=now - 3000 + shard,
            total_events=table.num_rows,
            resumed_events=0,
            done_events=table.num_rows,
            remaining_events=0,
            ok_events=table.num_rows,
            prompt_tokens=12 * table.num_rows,
            output_tokens=2 * table.num_rows,
        )
        manifest = CompletionsShardManifest(
            shard=shard,
            rows=table.num_rows,
            ids_digest=ids_digest(table.column("event_id").to_pylist()),
            ok=table.num_rows,
            prompt_tokens=heartbeat.prompt_tokens,
            output_tokens=heartbeat.output_tokens,
            conversations=len(items),
            conversations_ids_digest=shard_manifests[shard].ids_digest,
            settings_fingerprint="bench",
        )
        publish_shard(store, manifest, [("completions.parquet", path)])
        path.unlink()
        write_heartbeat(store, heartbeat, first=False)

    with ThreadPoolExecutor(max_workers=PUBLISH_WORKERS) as pool:
        list(pool.map(publish, object_index.spread_over_blocks(range(num_shards))))


def copy_store(source: LocalStore, target: Store, workers: int = S3_WORKERS) -> None:
    """`target` as publishing the same shards there would have left it, from a copy of `source`'s objects (writing
    a store of 1,830 shards to moto through the stages' writers takes most of an hour on a small machine).

    Every object goes up through the store's own `put_bytes` (with its checksum), many at a time; each shard
    manifest then records its objects as publishing on this store does (`StoredObject.of` the stored object:
    size, checksum and, on S3, the ETag), and the index is rebuilt from the objects by `object_index.reconcile`,
    as the coverage check repairs it."""
    keys = [
        info.key
        for info in source.list()
        if not info.key.startswith(f"{object_index.INDEX_PREFIX}/") and info.key != BUILD_COMPLETE
    ]
    manifests = [key for key in keys if "/shard=" in key and key.endswith(MANIFEST_NAME)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        data = [key for key in keys if key not in set(manifests)]
        stored = dict(zip(data, pool.map(lambda key: target.put_bytes(key, source.get_bytes(key)), data)))

        def publish_manifest(key: str) -> bytes:
            body = orjson.loads(source.get_bytes(key))
            body["objects"] = [asdict(StoredObject.of(stored[o["key"]])) for o in body["objects"]]
            raw = orjson.dumps(body, option=orjson.OPT_INDENT_2)
            target.put_bytes(key, raw)
            return raw

        written = dict(zip(manifests, pool.map(publish_manifest, manifests)))
    heartbeats = {key: source.get_bytes(key) for key in data if key.startswith(HEARTBEATS_PREFIX)}
    finished = {key: raw for key, raw in heartbeats.items() if orjson.loads(raw)["state"] not in ACTIVE_STATES}
    finals = {**written, **finished}
    for top in {key.split("/", 1)[0] for key in finals}:
        object_index.reconcile(target, top, {key: raw for key, raw in finals.items() if key.startswith(f"{top}/")})


def local_store(events: int, num_shards: int, work_dir: Path) -> LocalStore:
    """The cached local store for this size (built on first use)."""
    root = work_dir / f"store-{events}-{num_shards}"
    done = root / BUILD_COMPLETE
    if not done.exists():
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=work_dir) as scratch:
            started = time.perf_counter()
            build_store(LocalStore(root), events, num_shards, Path(scratch))
            print(f"built {root} in {time.perf_counter() - started:.0f} s")
        done.write_text("complete\n")
    return LocalStore(root)


# measurements ---------------------------------------------------------------------------------------------


def timed(call: Callable[[], object], repeats: int = 3) -> tuple[float, object]:
    """Best of `repeats` wall-clock seconds, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        best = min(best, time.perf_counter() - started)
    return best, result


def status_in_process(env: dict[str, str]) -> None:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if cli.main(["status"]) != 0:
                raise RuntimeError("dflash status failed")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def per_object_reads(store: Store) -> int:
    """The simple alternative: list the manifests and heartbeats, then GET each (16 at a time)."""
    keys = [
        info.key
        for prefix in (f"{layout.COMPLETIONS}/shard=", HEARTBEATS_PREFIX)
        for info in store.list(prefix)
        if info.key.endswith(".json")
    ]
    return sum(len(json.loads(raw)) for raw in object_index.fetch_all(store, keys) if raw)


def dagster_home(work_dir: Path, num_shards: int) -> Path:
    """A Dagster instance with every completions shard materialized (events written through the instance API)."""
    import dagster as dg

    home = work_dir / f"dagster-home-{num_shards}"
    done = home / BUILD_COMPLETE
    if not done.exists():
        home.mkdir(parents=True, exist_ok=True)
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        saved = os.environ.get("DAGSTER_HOME")
        os.environ["DAGSTER_HOME"] = str(home)
        try:
            with dg.DagsterInstance.get() as instance:
                for key in layout.partition_keys(num_shards):
                    instance.report_runless_asset_event(
                        dg.AssetMaterialization(asset_key=layout.COMPLETIONS, partition=key)
                    )
        finally:
            if saved is None:
                os.environ.pop("DAGSTER_HOME")
            else:
                os.environ["DAGSTER_HOME"] = saved
        done.write_text("complete\n")
    return home


def bare_duckdb(store: Store) -> tuple[int, int, int]:
    """Missing, duplicated and unexpected events, in one DuckDB query over the same objects."""
    con = duckdb.connect()
    columns = "columns = {'id': 'VARCHAR', 'generate_after': 'INTEGER[]'}, auto_detect = false"
    if isinstance(store, LocalStore):
        planned_from = f"read_json('{store.root}/conversations/*/*.jsonl', format = 'newline_delimited', {columns})"
        recorded_from = f"read_parquet('{store.root}/completions/*/*.parquet')"
    else:
        filesystem, root = arrow_filesystem(store)
        conversations_keys = [i.key for i in store.list("conversations/shard=") if i.key.endswith(".jsonl")]
        completions_keys = [i.key for i in store.list("completions/shard=") if i.key.endswith(".parquet")]
        planned_objects = ds.dataset(  # noqa: F841 (DuckDB finds it by name)
            [f"{root}/{k}" for k in conversations_keys],
            format="json",
            schema=pa.schema([("id", pa.string()), ("generate_after", pa.list_(pa.int32()))]),
            filesystem=filesystem,
        )
        recorded_objects = ds.dataset(  # noqa: F841
            [f"{root}/{k}" for k in completions_keys],
            format="parquet",
            schema=pa.schema([("event_id", pa.string()), ("status", pa.string())]),
            filesystem=filesystem,
        )
        planned_from, recorded_from = "planned_objects", "recorded_objects"
    return con.execute(
        f"""WITH planned AS (SELECT id || '#turn' || unnest(range(len(generate_after))) AS event_id
                             FROM {planned_from}),
                 recorded AS (SELECT event_id FROM {recorded_from})
            SELECT (SELECT count(*) FROM planned ANTI JOIN recorded USING (event_id)),
                   (SELECT count(*) FROM (SELECT event_id FROM recorded GROUP BY 1 HAVING count(*) > 1)),
                   (SELECT count(*) FROM recorded ANTI JOIN planned USING (event_id))"""
    ).fetchone()


@dataclass
class Figures:
    where: str
    events: int
    shards: int
    collect_s: float
    status_s: float
    status_with_home_s: float
    per_object_s: float
    coverage_s: float
    bare_duckdb_s: float
    copy_s: float | None = None  # making the S3 store: copying the local one


def measure(where: str, store: Store, env: dict[str, str], home: Path) -> Figures:
    stage = read_conversations_manifest(store)
    num_shards = stage.num_shards
    collect_s, _ = timed(lambda: collect_status(store, [], materialized=set(range(num_shards))))
    status_s, _ = timed(lambda: status_in_process(env))
    with_home_s, _ = timed(lambda: status_in_process({**env, "DAGSTER_HOME": str(home)}))
    per_object_s, _ = timed(lambda: per_object_reads(store))
    coverage_s = bare_s = float("inf")
    for _ in range(3):  # interleaved, so that both see the same spells of load from other processes
        once_s, coverage = timed(lambda: dataset_coverage(store, num_shards), repeats=1)
        coverage_s = min(coverage_s, once_s)
        once_s, bare = timed(lambda: bare_duckdb(store), repeats=1)
        bare_s = min(bare_s, once_s)
    answer = (coverage.events_missing, coverage.events_duplicated, coverage.events_unexpected)
    if not coverage.exactly_once or tuple(bare) != answer:
        raise RuntimeError(f"{where}: coverage {answer} and bare DuckDB {tuple(bare)} disagree, or not exactly once")
    figures = Figures(
        where, stage.turns, num_shards, collect_s, status_s, with_home_s, per_object_s, coverage_s, bare_s
    )
    print(figures)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=REAL_EVENTS)
    parser.add_argument("--shards", type=int, default=REAL_SHARDS)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "dflash-bench-status-scale")
    parser.add_argument("--no-local", action="store_true", help="skip the local store's measurements")
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 (moto) measurements")
    parser.add_argument("--no-write", action="store_true", help="print, do not write BENCHMARKS.md")
    args = parser.parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    local = local_store(args.events, args.shards, args.work_dir)
    home = dagster_home(args.work_dir, args.shards)
    base_env = {"DFLASH_WORK_DIR": str(args.work_dir / "work"), "DAGSTER_HOME": ""}
    results = []
    if not args.no_local:
        results.append(measure("local", local, {**base_env, "DFLASH_STORE": local.uri}, home))
    if not args.no_s3:
        results.append(measure_s3(local, base_env, home))
    report(args, local, results)
    return 0


def measure_s3(local: LocalStore, base_env: dict[str, str], home: Path) -> Figures:
    from dagster_project.store.storage import RetryPolicy, bounded_client
    from tests.support.s3_server import running_s3_server

    with running_s3_server() as server:
        env = {**base_env, **server.env, "DFLASH_STORE": f"s3://{BUCKET}/store"}
        server.client().create_bucket(Bucket=BUCKET)
        client_args = {"endpoint_url": server.endpoint, "region_name": "us-east-1"}
        saved = {name: os.environ.get(name) for name in server.env}
        os.environ.update(server.env)
        try:
            store = S3Store(f"s3://{BUCKET}/store", bounded_client(RetryPolicy(), **client_args))
            started = time.perf_counter()
            copy_store(local, store)
            copy_s = time.perf_counter() - started
            print(f"copied the store to moto in {copy_s:.0f} s")
            return replace(measure("S3 (moto on loopback)", store, env, home), copy_s=copy_s)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def report(args: argparse.Namespace, local: LocalStore, results: list[Figures]) -> None:
    sizes = sum(info.size for info in local.list())
    rows = "\n".join(
        f"| {f.where} | {f.events:,} / {f.shards:,} | {f.collect_s:.2f} | {f.status_s:.2f} "
        f"| {f.status_with_home_s:.2f} | {f.per_object_s:.2f} | {f.coverage_s:.2f} | {f.bare_duckdb_s:.2f} "
        f"| {f.coverage_s / f.bare_duckdb_s:.2f}× |"
        for f in results
    )
    command = f"python -m benchmarks.bench_status_scale --events {args.events} --shards {args.shards}"
    copied = "".join(
        f"""* The S3 store is the local one copied to moto as publishing there would have left it (every object
  through the store's own writes, 16 at a time, each manifest recording its objects' ETags, the index rebuilt
  from the objects by the coverage check's `reconcile`): {f.copy_s:.0f} s (writing it through the stages' writers
  took 447 s for 400 shards in an earlier run). Both readers found every event exactly once in it.
"""
        for f in results
        if f.copy_s is not None
    )
    body = f"""## Status and coverage by id at scale (`python -m benchmarks.bench_status_scale`)

`{command}`
(the defaults are the real job's 913,786 events / 1,830 shards, on both stores): a store written with
the project's writers ({sizes / 2**20:,.0f} MiB locally: one-line answers), every shard published with its
run's last heartbeat, and a Dagster instance with every completions shard materialized. Seconds, best of 3
(coverage and bare DuckDB interleaved). The machine was shared: load average {os.getloadavg()[0]:.1f} on its
{os.cpu_count()} cores when the run ended, so absolute figures vary run to run by up to 2×; the ratios less.

| store | events / shards | `collect_status` | `dflash status` | with `DAGSTER_HOME` \
| baseline: one GET per manifest and heartbeat | coverage by id | bare DuckDB, same objects | coverage / DuckDB |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
{rows}

* `collect_status` is the store reads and the answers; `dflash status` is the command in-process
  (`cli.main(["status"])`, output discarded): the same plus its resources from the environment (on S3, the
  store's boto3 client) and, with `DAGSTER_HOME`, opening the instance, reading its materialized partitions
  and looking for dead runs. Interpreter start and imports are not counted.
{copied}* The store's index of manifests and finished runs' heartbeats makes status a few requests whatever the shard
  count; the baseline is the simple alternative, a listing and one GET per object, 16 at a time. Verifying
  the stored shards is the coverage check's work.
* Coverage by id checks every manifest against its object (on a local store it reads them; on S3 it compares
  the listing's ETags with those the index copies were made from and reads only what changed) and verifies
  every object (a listing; on a local store the SHA-256 of each file too) while DuckDB reads the conversations
  the store's index names (again, should the index disagree with the manifests), then joins the ids with
  DuckDB, which also answers per conversation (done, partial, missing, with errors, planned twice); bare DuckDB
  computes the same three counts in one query from the same objects (checked equal).
"""
    if args.no_write:
        print(body)
    else:
        print(f"wrote {write_section('status_scale', body)}")


if __name__ == "__main__":
    raise SystemExit(main())
