from pathlib import Path

import numpy as np
import pytest

from dagster_project import cli
from dagster_project.ops.projection import SEED_RUNNING, Job, project
from dagster_project.pilot_record import LengthDistribution, PilotRecord, write_pilot
from dagster_project.sglang.profiles.profile import profile_named
from dagster_project.store.storage import LocalStore

SEED_JOB = Job()  # 913,786 answers x 2,472 tokens on 7 B200 at $27/hour for the node


def test_the_seed_job_at_the_seeds_settings_takes_the_seeds_41_to_45_hours():
    seed = project(SEED_JOB).seed
    assert seed.running == SEED_RUNNING == 16
    assert 41.0 <= seed.hours <= 45.0
    assert seed.cost == pytest.approx(seed.hours * 27.0, rel=1e-3)  # $27/hour for the 7 GPUs


def test_tuning_runs_more_requests_per_gpu_and_says_what_binds():
    projection = project(SEED_JOB)
    seed, tuned, most = projection.settings
    assert seed.running < tuned.running <= most.running
    assert most.hours < tuned.hours < seed.hours
    assert tuned.output_rate >= 0.95 * most.output_rate  # the knee: within 5% of the best the memory allows
    assert tuned.binds.startswith("the curve") and most.binds.startswith("memory")
    assert tuned.flags[tuned.flags.index("--max-running-requests") + 1] == str(tuned.running)


def test_twice_the_gpus_take_half_the_hours_at_the_same_cost():
    one, two = project(SEED_JOB).tuned, project(Job(gpus=14)).tuned
    assert two.hours == pytest.approx(one.hours / 2)
    assert two.cost == pytest.approx(one.cost)


def test_a_measured_profile_file_projects_like_the_built_in_one(tmp_path):
    path = profile_named("h200-fp8").save(tmp_path / "measured.json")
    from_file = project(Job(profile=str(path)))
    assert from_file.settings == project(Job(profile="h200-fp8")).settings


def test_a_job_without_events_is_refused():
    with pytest.raises(ValueError, match="events"):
        Job(events=0)


def test_dflash_plan_project_prints_the_seed_and_tuned_table(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_STORE", str(tmp_path))  # no pilot there
    assert cli.main(["plan", "--project", "--profile", "b200-bf16", "--gpus", "7", "--events", "913786"]) == 0
    out = capsys.readouterr().out
    # The answer first, in words, as the README states it; then the table it comes from.
    assert out.startswith(
        "The batch can grow about 7× (118 running requests per GPU fit in memory against the seed's 16); throughput "
        "about 1.8× (x1.76 at 85 running: 23.7 h instead of 41.6 h, $639 instead of $1,123), because past 85 running "
        "every request brings its own memory traffic per step"
    ), out
    assert "| seed launch | 16 |" in out and "| tuned (knee) |" in out
    assert "assumptions (flagged):" in out and "request_bandwidth_efficiency" in out
    assert "inputs: the seed run's figures (no passed pilot in the store" in out


def test_dflash_plan_project_takes_a_passed_pilots_answer_and_prompt_lengths(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_STORE", str(tmp_path))
    lengths = LengthDistribution.of(np.full(50, 1800))
    record = PilotRecord(True, "f1", finished_at=1.8e9, answers=50, avg_prompt_tokens=900.0, output_lengths=lengths)
    write_pilot(LocalStore(tmp_path), record)
    assert cli.main(["plan", "--project", "--gpus", "7"]) == 0
    out = capsys.readouterr().out
    assert "x 1,800 output tokens (900-token prompts)" in out and f"inputs from the {record.label()}" in out
    assert cli.main(["plan", "--project", "--output-tokens", "2000"]) == 0  # a flag still overrides it
    assert "x 2,000 output tokens (900-token prompts)" in capsys.readouterr().out


def test_dflash_plan_project_refuses_an_unknown_profile_in_one_line():
    with pytest.raises(SystemExit, match="unknown profile 'x200'"):
        cli.main(["plan", "--project", "--profile", "x200"])


def test_the_readme_quotes_the_seed_jobs_projection_as_the_code_computes_it():
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert project(SEED_JOB).table() in readme


def test_a_built_in_profile_is_computed_at_the_jobs_own_context():
    long = project(Job(output_tokens=10_000, prompt_tokens=2_000))
    assert long.profile.context_tokens == 2_000 + 5_000
    # Longer contexts read more KV per step: the same batch decodes slower than at the seed's lengths.
    seed_profile = project(SEED_JOB).profile
    assert long.profile.curve().step_s(16) > seed_profile.curve().step_s(16)
