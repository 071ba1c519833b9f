"""`dflash plan --project` with and without `max_new_tokens: fit`: what each cap generates per answer, what a
trainer at max_length cuts of it, and the job's hours and dollars; from configured or measured lengths."""

from __future__ import annotations

import pytest

from dagster_project import cli
from dagster_project.ops.length_fit import FitOptions, LengthSample, compare_caps, project_caps
from dagster_project.ops.projection import Job


def test_a_plain_cap_generates_what_the_trainer_cuts_and_fit_does_not():
    # Half the answers 1,000 tokens, half 6,000; prompts of 96 tokens leave 4,000 of a 4,096-token row.
    sample = LengthSample.measured([1000, 6000], "a pilot of two")
    plain, fit = compare_caps(sample, FitOptions(max_new_tokens=32768, max_length=4096), prompt_tokens=96)
    assert (plain.generated, plain.trained) == (3500, 2500) and plain.cut_share == pytest.approx(1000 / 3500)
    assert (fit.generated, fit.trained, fit.cut_share) == (2500, 2500, 0.0)
    # A cap below the room: fit changes nothing.
    low, fitted = compare_caps(sample, FitOptions(max_new_tokens=2000, max_length=4096), prompt_tokens=96)
    assert low.generated == fitted.generated == 1500


def test_the_projection_says_which_lengths_it_used_and_fit_takes_fewer_hours():
    job = Job(events=913786, gpus=7, profile="b200-bf16")
    by_cap = project_caps(job, FitOptions(), LengthSample.configured("lognormal:1795:0.8", draws=20_000))
    (plain, plain_job), (fit, fit_job) = by_cap.rows
    assert 0.15 < plain.cut_share < 0.25 and fit.cut_share == 0.0  # about a fifth past a 4,096-token row
    assert fit_job.seed.hours < plain_job.seed.hours and fit_job.seed.cost < plain_job.seed.cost
    assert "answer lengths configured lognormal:1795:0.8 (20,000 draws)" in by_cap.table()
    assert (
        "measured: pilot p (2 answers)"
        in project_caps(job, FitOptions(), LengthSample.measured([10, 20], "pilot p")).source
    )
    with pytest.raises(ValueError, match="no measured answer lengths"):
        LengthSample.measured([], "an empty pilot")


def test_dflash_plan_project_prints_both_caps(capsys):
    assert cli.main(["plan", "--project", "--output-len", "fixed:5000", "--max-length", "4096"]) == 0
    out = capsys.readouterr().out
    assert "answer lengths configured fixed:5000" in out
    assert "| max_new_tokens 32,768 | 5,000 | 30.1% |" in out and "| fit (max_length 4,096) | 3,496 | 0.0% |" in out
