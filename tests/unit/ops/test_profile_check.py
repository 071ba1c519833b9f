"""A GPU run's curve in the GPU-profile format and its comparison with a profile (`dflash profile`), on a fixture
curve and on tune reports made up here: no server, no GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dagster_project.cli import main
from dagster_project.ops import profile_check
from dagster_project.ops.spec_compare import SpecTrial, compare, not_measured
from dagster_project.ops.tune import TuneReport
from dagster_project.ops.tune_point import TunePoint
from dagster_project.sglang.profiles.profile import SEED_SPEC, SPEC_OFF, GpuProfile, SpecSettings

FIXTURE = Path(__file__).parents[2] / "fixtures" / "profiles" / "h200_measured_dummy.json"
H200 = profile_check.MeasuredRun("h200", memory_gib=140.4, weights_gib=52.31, random_weights=True)


def point(concurrency: int, rate: float, cap: int = 48, servers: int = 2, accept: float | None = 3.0) -> TunePoint:
    """A point of two servers, 600-token prompts, 2,000-token answers, 0.3 s TTFT."""
    return TunePoint("as running", concurrency, cap, servers, 40, 0, rate, 1.0, accept, 0.3, 0.5, 9.0, 12.0, 600,
                     2000, 30.0)  # fmt: skip


def report(points: list[TunePoint], speculative=None) -> TuneReport:
    knee = points[-1]
    return TuneReport(0.0, ["a", "b"], "synthetic", 16, 0.95, points, knee, 0.0, [], "", speculative=speculative)


def test_the_compare_command_holds_a_profile_that_the_fixture_meets(tmp_path, capsys):
    assert main(["profile", "compare", str(FIXTURE), "--profile", "h200-bf16", "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("h200-bf16-measured against profile h200-bf16: the profile holds: measured decode steps")
    assert "NEXTN 3/1/4            8      29.10    27.25   1.07" in out and "MTP off               48" in out
    assert "note: KV cache dtype differs: measured auto, profile fp8_e4m3" in out
    written = json.loads((tmp_path / "c.json").read_text())
    assert len(written["points"]) == 5 and written["accept_lengths"] == []  # random weights: not compared


def test_a_slower_gpu_makes_the_profile_optimistic_and_an_unknown_profile_is_a_clear_error(tmp_path, capsys):
    slow = json.loads(FIXTURE.read_text())
    for curve in slow["curves"]:
        curve["points"] = [[running, step * 1.4] for running, step in curve["points"]]
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    main(["profile", "compare", str(tmp_path / "slow.json"), "--profile", "h200-bf16"])
    out = capsys.readouterr().out
    assert "the profile is optimistic: measured decode steps 1.47x its own" in out
    assert "outside ±15%: NEXTN 3/1/4 at 8 running (1.50x)" in out and "dflash plan --project --profile" in out
    with pytest.raises(SystemExit, match="dflash profile compare: unknown profile 'a100-bf16'"):
        main(["profile", "compare", str(FIXTURE), "--profile", "a100-bf16"])


def test_a_sweep_becomes_a_profile_that_reproduces_every_measured_rate(tmp_path):
    points = [point(8, 2000.0), point(24, 4800.0), point(48, 6600.0), point(60, 6700.0), point(60, 6500.0)]
    measured = profile_check.measured_profile(report(points, not_measured(48, "3/1/4", 3.0)), H200)
    (curve,) = measured.curves
    assert curve.spec == SEED_SPEC and [b for b, _ in curve.points] == [8, 24, 48]  # 60 in flight run 48
    assert measured.prefill_s_per_token == pytest.approx(0.3 / 600)
    for running, rate in ((8, 1000.0), (24, 2400.0)):  # per GPU: two servers
        assert measured.output_rate(running, 2000, 600) == pytest.approx(rate)
    # Past the cap the measured points fold onto it, averaged (repeats first: 6,700 and 6,500 at 60 in flight).
    assert measured.output_rate(48, 2000, 600) == pytest.approx(3300.0)
    assert profile_check.RANDOM_WEIGHTS in measured.flagged
    assert GpuProfile.load(measured.save(tmp_path / "m.json")) == measured  # the profile format, field for field


def test_a_launch_mode_comparison_adds_a_one_point_curve_per_speculative_setting():
    trials = [SpecTrial("3/1/4", 6600.0, 3.0, baseline=True), SpecTrial("off", 3000.0, None),
              SpecTrial("2/1/3", 6000.0, 2.5)]  # fmt: skip
    points = [point(8, 2000.0), point(48, 6600.0)]
    measured = profile_check.measured_profile(report(points, compare(48, trials, 0.02)), H200)
    assert [c.spec for c in measured.curves] == [SEED_SPEC, SPEC_OFF, SpecSettings(2, 1, 3)]
    off = measured.curve(SPEC_OFF)
    assert off.points[0][0] == 48 and off.accept_length == 1.0
    assert measured.output_rate(48, 2000, 600, SPEC_OFF) == pytest.approx(1500.0)
