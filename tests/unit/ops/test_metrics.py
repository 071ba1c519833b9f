"""The Prometheus exporter: every sample it renders is a figure of `dflash status --json` (the same status, read
back through the JSON the command prints), in base units; an unknown figure has no sample, never a 0."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from dagster_project.ops.metrics import render_metrics
from tests.support.full_status import full_status

COST_FIGURES = {
    "dflash_cost_per_hour_dollars": "cost_per_hour",
    "dflash_cost_gpus": "gpus",
    "dflash_cost_spent_dollars": "spent",
    "dflash_cost_to_finish_dollars": "to_finish",
    "dflash_cost_to_finish_plan_dollars": "to_finish_plan",
    "dflash_cost_per_million_output_tokens_dollars": "per_million_output_tokens",
    "dflash_cost_gpu_hours_per_1k_rows": "gpu_hours_per_1k_rows",
    "dflash_cost_gpu_hours": "gpu_hours",
    "dflash_cost_per_million_trained_tokens_dollars": "per_million_trained_tokens",
    "dflash_cost_fleet_idle_dollars": "idle_cost",
}
WASTE_FIGURES = {
    "dflash_generated_output_tokens": "generated_output_tokens",
    "dflash_trained_output_tokens": "trained_output_tokens",
    "dflash_pending_output_tokens": "pending_output_tokens",
}
SERVER_FIGURES = {
    "dflash_server_client_window": "client_window",
    "dflash_server_in_flight": "in_flight",
    "dflash_server_cap": "effective_cap",
    "dflash_server_running": "running",
    "dflash_server_queued": "queued",
    "dflash_server_kv_usage": "kv_usage",
    "dflash_server_mamba_usage": "mamba_usage",
}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


WATCH_FIGURES = {
    "dflash_watch_figure": "figure",
    "dflash_watch_threshold": "threshold",
    "dflash_watch_sample_size": "sample_size",
    "dflash_watch_passed": "passed",
}


def expected_from_json(answers: dict) -> dict[tuple[str, tuple], float]:
    """What each sample must be, read from `dflash status --json`'s output."""
    progress, mtp, shards = answers["progress"], answers["mtp"], answers["shards"]
    job = {
        "dflash_status_collected_timestamp_seconds": answers["collected_at"],
        "dflash_events_planned": progress["events_planned"],
        "dflash_events_done": progress["events_done"],
        "dflash_events_ok": progress["events_ok"],
        "dflash_events_remaining": progress["events_remaining"],
        "dflash_fraction_done": progress["fraction_done"],
        "dflash_eta_seconds": progress["eta_hours"] * 3600,
        "dflash_plan_eta_seconds": progress["plan_eta_hours"] * 3600,
        "dflash_window_requests_per_second": progress["window_req_per_s"],
        "dflash_window_output_tokens_per_second": progress["window_output_tok_per_s"],
        "dflash_lifetime_requests_per_second": progress["lifetime_req_per_s"],
        "dflash_lifetime_output_tokens_per_second": progress["lifetime_output_tok_per_s"],
        "dflash_shards_running": len(progress["shards_running"]),
        "dflash_shards_dead": len(progress["shards_dead"]),
        "dflash_shards_failed": len(progress["shards_failed"]),
        "dflash_shards_total": shards["shards"],
        "dflash_job_done": shards["done"],
        "dflash_line_held": answers["quality"]["hold"] is not None,
        "dflash_mtp_on": mtp["mtp_on"],
        "dflash_accept_length_window": mtp["accept_length_window"],
        "dflash_accept_length_published_shards": mtp["accept_length_published_shards"],
        **{name: answers["cost"][key] for name, key in COST_FIGURES.items()},
        "dflash_cost_fleet_idle_seconds": (
            None if answers["cost"]["idle_hours"] is None else answers["cost"]["idle_hours"] * 3600
        ),
        **{name: answers["waste"][key] for name, key in WASTE_FIGURES.items()},
    }
    expected = {(name, ()): float(value) for name, value in job.items() if value is not None}
    for key in ("output_tokens", "answers", "gpu_seconds", "dollars"):
        for cause, value in answers["waste"][key].items():
            expected[(f"dflash_waste_{key}", (("cause", cause),))] = value
    for url, row in answers["concurrency"]["servers"].items():
        for name, key in SERVER_FIGURES.items():
            expected[(name, (("server", url),))] = float(row[key])
    for url, accept in mtp["server_avg_spec_accept_length"].items():
        expected[("dflash_server_spec_accept_length", (("server", url),))] = accept
    for stage in ("completions", "training_set", "export"):
        for state, count in shards[stage].items():
            expected[("dflash_shards", (("stage", stage), ("state", state)))] = float(count)
    for figure in answers["quality"]["fleet"]:
        for name, key in WATCH_FIGURES.items():
            expected[(name, (("gate", figure["gate"]),))] = float(figure[key])
    for alert in answers["alerts"]:
        key = ("dflash_alerts", (("kind", alert["kind"]),))
        expected[key] = expected.get(key, 0.0) + 1
    return expected


def test_every_sample_is_the_figure_dflash_status_json_prints(tmp_path):
    status = full_status(tmp_path)
    answers = json.loads(json.dumps(dataclasses.asdict(status), default=str))  # as `dflash status --json` prints
    rendered = samples(render_metrics(status))
    assert rendered == expected_from_json(answers)
    # The made-up readings know every figure: none of the comparison above is between two absences.
    assert ("dflash_eta_seconds", ()) in rendered and ("dflash_cost_spent_dollars", ()) in rendered
    assert rendered[("dflash_alerts", (("kind", "eta"),))] == 1.0
    assert rendered[("dflash_server_in_flight", (("server", "http://127.0.0.1:30000"),))] == 22.0


def test_a_figure_the_status_does_not_know_has_no_sample_rather_than_a_zero(tmp_path):
    status = full_status(tmp_path, priced=False)
    status = dataclasses.replace(status, progress=dataclasses.replace(status.progress, eta_hours=None))
    names = {name for name, _ in samples(render_metrics(status))}
    assert status.cost is None
    assert not any(name.startswith("dflash_cost_") for name in names)
    assert "dflash_eta_seconds" not in names and "dflash_plan_eta_seconds" in names


def test_dflash_metrics_once_prints_the_figures_and_imports_neither_dagster_nor_the_tokenizer(tmp_path):
    """In a fresh interpreter as the command runs (an empty local store: nothing planned yet)."""
    probe = (
        "import sys, io, contextlib, json\n"
        "from dagster_project import cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    code = cli.main(['metrics', '--once'])\n"
        "heavy = sorted(m for m in ('dagster', 'transformers', 'botocore', 'aiohttp') if m in sys.modules)\n"
        "print(json.dumps({'code': code, 'out': out.getvalue(), 'heavy': heavy}))\n"
    )
    environment = {**os.environ, "DFLASH_STORE": str(tmp_path / "store"), "DAGSTER_HOME": ""}
    environment.pop("DFLASH_SGLANG_ENDPOINTS", None)
    result = subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["code"] == 0 and report["heavy"] == []
    rendered = samples(report["out"])
    assert rendered[("dflash_events_planned", ())] == 0.0 and ("dflash_eta_seconds", ()) not in rendered
