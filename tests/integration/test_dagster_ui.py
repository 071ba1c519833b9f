"""`dagster dev` shows the pipeline, a backfill over every shard works from the UI with the daemon, and the
operator's page reads in a real browser.

One `dagster dev -w workspace.yaml` (webserver, daemon, code server; the repository's workspace.yaml, as `make dev`
runs it, so the location it names is the one loaded) serves both tests of this module: it runs as its own process
group on a temp DAGSTER_HOME holding the project's dagster.yaml, with the `sglang_fleet` pool set to 1 through
`dagster instance concurrency set` (OPERATIONS §4.3). Before it starts, the conversations are published and their
pilot passed in-process, a plan and a price are set, and `run_report` is materialized through the Dagster CLI (the
start of the page's chart). Through its GraphQL endpoint — what the UI's pages and buttons call — the module's
fixture reads the shard partitions and launches a partition backfill of the shard assets over all shards
(`launchPartitionBackfill`, the Materialize dialog's "launch backfill"), waits for the daemon to run it, then
materializes `run_report` again through the CLI.

The first test checks what the UI shows of it: the assets, their checks, pools and shards; one run per shard
(`DFLASH_SHARDS_PER_RUN=1`; the backfill policy tags each with a range of one shard) and with the backfill's tag;
every shard materialized; every check evaluated on every shard and attributed to it (as the UI's check pages show
it); and the pool: the two shards' `completions` steps never overlap in time.

The second opens the `run_report` asset page and a completions partition page in headless Chromium
(tests/support/browser.py) and asserts that the asset's overview shows, in place and without opening a dialog, the
six answers, the per-server table, cost and the chart of the run (an inline SVG image with axes); that at 1,600 px
and, the same window resized, at 1,440 px nothing of the page needs sideways scrolling, and the alerts begin within
a 1,440 x 900 screen (measured by element boxes); and that the page's
Materialize button runs Dagster's hidden asset job, which the asset tags. Screenshots and the pages' text are saved
under `test-artifacts/browser/`.

Kept lean: two shards, short answers, conversations published in-process beforehand, one `dagster dev` and one
backfill for both tests.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from dagster_project.ops.plan import Plan, write_plan
from dagster_project.store.storage import LocalStore
from tests.support import browser as page
from tests.support.dagster_helpers import (
    BACKFILL_RUNS,
    DAGSTER,
    DEFS_MODULE,
    EXPECTED_ASSETS,
    EXPECTED_CHECKS,
    FAST_ANSWERS,
    FINISHED,
    SHARD_ASSETS,
    DagsterDev,
    check_evaluations,
    dagster_home,
    materialize_all,
    materialized_partitions,
    page_refreshed_after,
    pipeline_env,
    publish_conversations,
    run_cli,
    shard_of_run,
    step_windows,
)
from tests.support.paths import PROJECT_ROOT
from tests.support.pilots import pass_pilot_of_env
from tests.support.sglang_fixtures import SimFleet, wait_until

NUM_SHARDS = 2
SHARDS = [f"shard-{i:05d}" for i in range(NUM_SHARDS)]
POOL = "sglang_fleet"
MATERIALIZE_REPORT = [DAGSTER, "asset", "materialize", "-m", DEFS_MODULE, "--select", "run_report"]
ALERTING_REPORT = '{"ops": {"run_report": {"config": {"accept_length_floor": 9.0}}}}'

ASSET_NODES = """
{
  assetNodes {
    assetKey { path }
    groupName
    isPartitioned
    partitionKeys
    pools
    assetChecksOrError { __typename ... on AssetChecks { checks { name blocking } } }
  }
}
"""

SHARD_STATUS = """
query Status($keys: [AssetKeyInput!]) {
  assetNodes(assetKeys: $keys) {
    assetKey { path }
    assetPartitionStatuses { ... on DefaultPartitionStatuses { materializedPartitions failedPartitions } }
    assetChecksOrError {
      ... on AssetChecks {
        checks {
          name
          partitionStatuses { ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions } }
        }
      }
    }
  }
}
"""


def _key(path: list[str]) -> str:
    return "/".join(path)


@dataclass
class OperatorUI:
    """The module's `dagster dev`, its instance and fleet, and the runs of the backfill launched through it."""

    dev: DagsterDev
    home: Path
    fleet: SimFleet
    runs: list[dict]


@pytest.fixture(scope="module")
def operator_ui(tmp_path_factory) -> Iterator[OperatorUI]:
    root = tmp_path_factory.mktemp("operator_ui")
    # A store path as long as a production one (s3://bucket/prefix): pytest's temporary path is twice that, and a
    # path cannot wrap, so it alone would widen the operator's page.
    store = Path(tempfile.mkdtemp(prefix="store-"))
    try:
        with SimFleet.start(2, root / "fleet", **FAST_ANSWERS, enable_metrics=True) as fleet:
            home = dagster_home(root / "dagster_home")
            env = pipeline_env(
                home=home,
                store=store,
                work_dir=root / "work",
                num_shards=NUM_SHARDS,
                endpoints=fleet.urls,
                # A run per shard, to see the pool make them take turns; a price, for the page's cost figures.
                extra={"DFLASH_SHARDS_PER_RUN": "1", "DFLASH_COST_PER_GPU_HOUR": "3.50"},
            )
            run_cli([DAGSTER, "instance", "concurrency", "set", POOL, "1"], env=env, cwd=root)
            publish_conversations(home, store, env)
            pass_pilot_of_env(home, env)  # the shards' pilot; the plan below replaces the one it made
            plan = Plan(source="browser test", req_per_s=20.0, avg_output_tokens=100, output_tok_per_s=2000)
            write_plan(LocalStore(store), plan)
            run_cli(MATERIALIZE_REPORT, env=env, cwd=root, timeout_s=300)  # before the shards: the chart's start

            with DagsterDev.running(env, root) as dev:
                # The Materialize dialog: all partitions of the shard assets, "launch backfill".
                backfill = materialize_all(dev, "all shards")

                def finished_runs() -> list[dict] | None:
                    runs = dev.query(BACKFILL_RUNS, {"backfill": backfill})["runsOrError"]["results"]
                    done = len(runs) >= NUM_SHARDS and all(run["status"] in FINISHED for run in runs)
                    return runs if done else None

                runs = wait_until(finished_runs, timeout_s=300, interval_s=1.0, what="the daemon to run the backfill")
                # The page after the shards, with an alert to show: an accept-length floor no run reaches. Once the
                # sensor has refreshed the page for the backfill's end, so that refresh (default config) cannot
                # land after this one and replace the alert.
                # Asked once a second, as the other waits on the webserver: at wait_until's default (every 10 ms) its
                # two GraphQL queries kept the webserver busy for the whole of the sensor's refresh run.
                wait_until(
                    lambda: page_refreshed_after(dev, backfill),
                    timeout_s=120,
                    interval_s=1.0,
                    what="the page's refresh",
                )
                run_cli([*MATERIALIZE_REPORT, "--config-json", ALERTING_REPORT], env=env, cwd=root, timeout_s=300)
                yield OperatorUI(dev, home, fleet, runs)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def test_dagster_dev_shows_the_pipeline_and_a_backfill_runs_every_shard_under_the_pool(operator_ui):
    dev, runs = operator_ui.dev, operator_ui.runs
    # What the asset graph and asset pages show: the assets, their groups, checks, pools and shards.
    nodes = {_key(n["assetKey"]["path"]): n for n in dev.query(ASSET_NODES)["assetNodes"]}
    assert set(nodes) == set(EXPECTED_ASSETS)
    for name, (group, partitioned, _) in EXPECTED_ASSETS.items():
        node = nodes[name]
        assert node["groupName"] == group and node["isPartitioned"] == partitioned, name
        assert node["partitionKeys"] == (SHARDS if partitioned else []), name
        checks = {c["name"]: c["blocking"] for c in node["assetChecksOrError"].get("checks", [])}
        assert checks == EXPECTED_CHECKS.get(name, {}), name
    assert nodes["completions"]["pools"] == [POOL]

    # The backfill the fixture launched from the Materialize dialog: one run per shard, all succeeded.
    tags = [{t["key"]: t["value"] for t in run["tags"]} for run in runs]
    assert len(runs) == NUM_SHARDS, tags
    assert [run["status"] for run in runs] == ["SUCCESS"] * NUM_SHARDS, dev.log()[-5000:]
    assert sorted(shard_of_run(t) for t in tags) == SHARDS
    partition_of_run = {run["runId"]: shard_of_run(t) for run, t in zip(runs, tags)}

    # What the asset and check pages show per shard.
    status = dev.query(SHARD_STATUS, {"keys": [{"path": [a]} for a in SHARD_ASSETS]})["assetNodes"]
    for node in status:
        name = _key(node["assetKey"]["path"])
        assert sorted(node["assetPartitionStatuses"]["materializedPartitions"]) == SHARDS, name
        for check in node["assetChecksOrError"].get("checks", []):
            statuses = check["partitionStatuses"]
            assert sorted(statuses["succeededPartitions"]) == SHARDS, (name, check["name"], statuses)

    instance = dg.DagsterInstance.from_config(str(operator_ui.home))
    try:
        assert materialized_partitions(instance, SHARD_ASSETS) == {asset: set(SHARDS) for asset in SHARD_ASSETS}
        for asset in ("completions", "training_set"):
            evaluations = check_evaluations(instance, asset)
            assert set(evaluations) == {(name, shard) for name in EXPECTED_CHECKS[asset] for shard in SHARDS}, asset
            for (name, shard), records in evaluations.items():
                assert [partition_of_run[r.run_id] for r in records] == [shard], (asset, name)

        # The pool: one slot, and the shards' completions steps took turns.
        assert instance.event_log_storage.get_concurrency_info(POOL).slot_count == 1
        windows = sorted(step_windows(instance, run_id, "completions") for run_id in partition_of_run)
        for (_, first_end), (second_start, _) in zip(windows, windows[1:]):
            assert second_start >= first_end, f"completions steps overlapped under a pool of 1: {windows}"
    finally:
        instance.dispose()


@pytest.fixture
def browser() -> Iterator:
    with page.headless_chromium() as driver:
        yield driver


def _runs_with_purpose(dev: DagsterDev, purpose: str, count: int) -> list[dict] | None:
    """The runs tagged `dflash/purpose: <purpose>`, once there are `count` of them."""
    result = dev.query("{ runsOrError { ... on Runs { results { runId jobName tags { key value } } } } }")
    runs = [
        run for run in result["runsOrError"]["results"] if {"key": "dflash/purpose", "value": purpose} in run["tags"]
    ]
    return runs if len(runs) >= count else None


def test_the_operator_page_renders_the_six_answers_and_the_per_server_table(operator_ui, browser):
    from selenium.webdriver.common.by import By

    dev, artifacts = operator_ui.dev, page.ARTIFACTS
    base = f"http://127.0.0.1:{dev.port}"
    browser.get(f"{base}/assets/run_report")
    try:
        page.wait_for(browser, page.SIX_ANSWERS[-1])  # on the asset's overview, in its latest materialization
        page.wait_for_inline_chart(browser)
    finally:
        report = page.save(browser, "run_report")
    table = page.metadata_table(browser)
    page.save_element(browser, table, "operator_page")
    # At 1,600 px every answer reads without sideways scrolling: no value cut off at the right.
    assert browser.execute_script("return window.innerWidth") == page.WINDOW_WIDTH
    assert page.clipped(browser, table) == []
    # The same window at 1,440 px: still nothing cut off at the right (the chart narrows with the page).
    page.resize(browser, page.NARROW_WIDTH)
    page.save(browser, f"run_report_{page.NARROW_WIDTH}")
    (artifacts / f"run_report_{page.NARROW_WIDTH}_widths.txt").write_text(page.column_widths(browser, table))
    assert page.clipped(browser, table) == []
    # ... and the verdict with a line for each of the six answers ("At a glance", the page's first entry) is whole
    # within a 1,440 x 900 laptop's first screen (the element's box), the alerts (here an MTP alert) right after.
    glance = page.row_bounds(browser, table, "At a glance")
    assert glance is not None and glance[1] <= page.FIRST_SCREEN_HEIGHT, glance
    assert "At a glance" in report and all(f"{n}. " in report for n in range(1, 7))
    assert "accept length" in report and "below 9" in report and "No alerts." not in report
    page.resize(browser, page.WINDOW_WIDTH)
    # All of it in place, nothing in a dialog or over the page: the instance turns off Dagster's newsletter
    # dialog for a new browser (`nux` in dagster.yaml), which would open over the page a while after it loads.
    assert browser.find_elements(By.CSS_SELECTOR, "[role='dialog']") == []
    for answer in page.SIX_ANSWERS:
        assert answer in report, answer
    # The per-server tables, drawn in place: their headers and one row per server of the fleet.
    assert "busy/cap" in report and "its model; what limits it now; its cap" in report
    for url in operator_ui.fleet.urls:
        assert url.removeprefix("http://") in report, url
    assert "$7.00" in report  # the fleet's $/hour: 2 servers at $3.50 per GPU-hour
    assert "×plan" in report and " UTC" in report and "{" not in report
    # Only the whole page in one document (the `report` entry, to copy) still opens in a dialog.
    assert report.count("[Show Markdown]") == 1
    assert "Events done (blue)" in report and "dashed: the plan, 20 req/s" in report  # the chart's caption
    # The chart has axes: their lines, round tick labels on both, the time's unit and the values' title.
    chart = page.chart(browser, "events done over time")
    labels = [text.text for text in chart.iter(f"{page.SVG}text")]
    assert chart.find(f"{page.SVG}path") is not None and labels[0] == "events done" and "0" in labels
    assert any(label.endswith(" min") for label in labels), labels

    browser.get(f"{base}/assets/completions?view=partitions&partition=shard-00000")  # the shard's own page
    try:
        page.wait_for(browser, "output_tok_per_s")
    finally:
        partition = page.save(browser, "completions_shard-00000")
    assert "shard-00000" in partition and "spec_accept_length" in partition

    # The asset page's Materialize button: Dagster runs it in its hidden asset job, which the asset tags.
    browser.get(f"{base}/assets/run_report")
    page.wait_for(browser, page.SIX_ANSWERS[-1])
    page.click(browser, "Materialize")
    runs = wait_until(
        lambda: _runs_with_purpose(dev, "materialize run_report", count=3),
        timeout_s=page.PAGE_TIMEOUT_S * 3,
        interval_s=1.0,
        what="the run launched from the asset page to be tagged",
    )
    assert {run["jobName"] for run in runs} == {"__ASSET_JOB"}  # two from the CLI, one from the button
    # The backfill's runs, launched from the Materialize dialog, are in the same hidden job, tagged the same way.
    shard_runs = _runs_with_purpose(dev, "materialize " + ", ".join(sorted(SHARD_ASSETS)), count=NUM_SHARDS)
    assert {run["jobName"] for run in shard_runs} == {"__ASSET_JOB"}
    browser.get(f"{base}/runs")
    try:
        page.wait_for(browser, "materialize run_report")
    finally:
        page.save(browser, "runs")
    if os.environ.get("UPDATE_README_SCREENSHOT"):  # refresh the README's picture: UPDATE_README_SCREENSHOT=1
        shutil.copyfile(artifacts / "operator_page.png", PROJECT_ROOT / "docs" / "images" / "operator_page.png")
