"""`dflash tune` and the `fleet_tuning` asset against simulator processes: connect mode on the published prompts,
launch mode restarting simulators between server settings, and the report status then quotes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.fleet_tuning import fleet_tuning
from dagster_project.ops import tune, tune_render
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.settings import DEMO_DATA_DIR
from dagster_project.store.storage import LocalStore
from tests.support.ingest_helpers import run_stages
from tests.support.model_families import DEEPSEEK, family_settings

# Short answers and quick steps that slow with the batch: a sweep takes seconds.
FAST = {"output_len": "uniform:20:40", "decode_step_s": 0.001, "decode_step_growth": 0.05, "enable_metrics": True}
SWEEP = ["--concurrencies", "1,4,8", "--refine", "1", "--rounds", "3", "--max-new-tokens", "64", "--sample", "16"]


def dflash(env: dict, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "DFLASH_STORE": str(tmp_path / "store"), "DFLASH_WORK_DIR": str(tmp_path / "work")}


def test_tune_sweeps_the_running_fleet_on_the_published_prompts(env, tmp_path, sim_fleet):
    run_stages(tmp_path, [str(DEMO_DATA_DIR)], num_shards=2)  # the store of `env`
    fleet = sim_fleet(2, max_running_requests=8, **FAST)
    out = dflash(env, "tune", "--endpoints", ",".join(fleet.urls), *SWEEP, "--out", str(tmp_path / "report"))
    assert "knee at" in out and "80% interval" in out  # the knee with its uncertainty
    assert "recommended flags: --disable-radix-cache --max-running-requests" in out
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["prompts_source"].startswith("published conversations") and report["prompts"] == 16
    assert {1, 4, 8} <= {p["concurrency"] for p in report["points"]}  # and the fitted knee, measured
    assert all(p["errors"] == 0 and p["output_tok_per_s"] > 0 and p["accept_length"] for p in report["points"])
    assert all(p["servers"] == 2 and p["cap"] == 8 for p in report["points"])
    assert (tmp_path / "report" / "throughput.svg").read_text().startswith("<svg")
    # Every request the sweep sent was one of the sampled prompts, spread over both servers.
    # (less the one-token probes of the served-model check before each point)
    assert len(fleet.job_requests(0)) == len(fleet.job_requests(1)) == sum(p["requests"] for p in report["points"]) // 2
    stored = tune.read_report(LocalStore(env["DFLASH_STORE"]))
    assert stored is not None and stored.knee is not None and stored.recommended_flags
    # The running fleet's flags cannot change: MTP on vs off is not measured, and the report says so.
    assert not stored.speculative.measured and "speculative decoding: MTP on vs off not measured" in out


def test_tune_in_launch_mode_restarts_simulators_per_server_setting(env, tmp_path):
    options = [f"--sim-option={name}={json.dumps(value)}" for name, value in FAST.items()]
    out = dflash(
        env, "tune", "--simulate", "1", *options, "--sweep", "max_running_requests=2,8", "--spec-settings", "off,2/1/3",
        "--synthetic-prompt-tokens", "100", *SWEEP, "--out", str(tmp_path / "report"),
    )  # fmt: skip
    report = tune.read_report(LocalStore(env["DFLASH_STORE"]))
    assert {p.server_setting for p in report.points} == {"max_running_requests=2", "max_running_requests=8"}
    assert {p.cap for p in report.points if p.server_setting.endswith("=2")} == {2}
    # Two running at once cannot beat eight: the knee is under the larger cap, and its flags say so.
    assert report.knee.server_setting == "max_running_requests=8"
    assert report.recommended_flags[-2:] == ["--max-running-requests", str(min(report.knee.concurrency, 8))]
    assert "tune [max_running_requests=2]" in out and not (tmp_path / "work" / "tune-fleet" / "fleet.json").exists()
    # MTP measured at the knee: the knee's setting relaunched without it and with a shorter chain, capped there.
    spec = report.speculative
    running = int(report.recommended_flags[-1])
    assert spec.measured and spec.concurrency == running
    assert [(t.setting, t.baseline) for t in spec.trials] == [("3/1/4", True), ("off", False), ("2/1/3", False)]
    assert all(t.output_tok_per_s > 0 and t.errors == 0 for t in spec.trials)
    off, shorter = spec.trials[1:]
    assert off.accept_length is None and shorter.accept_length < spec.trials[0].accept_length  # no spec stats off
    assert "tune [max_running_requests=8, speculative off]" in out
    assert spec.verdict.startswith("MTP on: +") and f"speculative decoding: {spec.verdict}" in out
    assert "## Speculative decoding" in (tmp_path / "report" / "report.md").read_text()


def test_tune_in_launch_mode_serves_the_jobs_model(env, tmp_path):
    """Under `DFLASH_TOKENIZER`/`DFLASH_SERVED_MODEL` of DeepSeek-R1 the simulators it starts serve that model, as
    `fleet up --simulate` does: each point's served-model check (name, vocabulary, end id) passes, and the synthetic
    prompts are ids its 129,280-row embedding takes. (Simulators of Qwen3.6 fail that check: tune stops.)"""
    env = {**env, **family_settings(DEEPSEEK)}
    options = [f"--sim-option={name}={json.dumps(value)}" for name, value in FAST.items()]
    dflash(
        env, "tune", "--simulate", "1", *options, "--spec-settings", "off", "--synthetic-prompt-tokens", "100",
        *SWEEP, "--out", str(tmp_path / "report"),
    )  # fmt: skip
    report = tune.read_report(LocalStore(env["DFLASH_STORE"]))
    assert report.knee is not None and {1, 4, 8} <= {p.concurrency for p in report.points}
    assert all(p.errors == 0 and p.output_tok_per_s > 0 for p in report.points)


def test_the_fleet_tuning_asset_records_the_sweep(tmp_path, sim_fleet):
    store = run_stages(tmp_path, [str(DEMO_DATA_DIR)], num_shards=2).store
    fleet = sim_fleet(1, max_running_requests=8, **FAST)
    resources = {
        "store": DatasetStore(root=store.uri, work_dir=str(tmp_path / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "fleet": SGLangFleet(endpoints=fleet.urls),
        "generation": GenerationConfig(max_new_tokens=64),
    }
    config = {"concurrencies": [1, 4, 8], "refine": 1, "rounds": 3, "sample": 16}
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [fleet_tuning],
            resources=resources,
            instance=instance,
            run_config={"ops": {"fleet_tuning": {"config": config}}},
        )
        assert result.success
        metadata = result.asset_materializations_for_node("fleet_tuning")[0].metadata
        observations = result.asset_observations_for_node("fleet_tuning")
    report = tune.read_report(store)
    assert metadata["knee_concurrency"].value == report.knee_estimate.concurrency == report.knee.concurrency
    assert metadata["knee_interval"].value == f"{report.knee_estimate.low}-{report.knee_estimate.high} (80%)"
    assert metadata["recommended_flags"].value == " ".join(report.recommended_flags)
    assert metadata["speculative"].value == report.speculative.verdict  # the fleet as it runs: not measured
    assert metadata["speculative"].value.startswith("MTP on vs off not measured")
    assert len(metadata["points"].value.records) == len(report.points) == len(observations) >= 3
    assert [o.metadata["concurrency"].value for o in observations] == sorted(p.concurrency for p in report.points)
    assert store.exists(tune_render.CHART_KEY) and store.exists(tune_render.MARKDOWN_KEY)
