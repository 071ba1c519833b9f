"""A GPU run against a GPU profile: the curve a `dflash tune` on a real server measured, written in the profile
format (`sglang.profiles.profile.GpuProfile`), and compared point by point with a profile, so that the first GPU
run replaces the profile's assumptions with measurements (`scripts/gpu_check.sh` does both).

**From a sweep to a profile.** A profile's output rate with b requests running is
`1 / (step(b) / (b x A) + (ttft + prompt x prefill) / output)` per GPU (A the accept length). Each measured point
(per GPU: the fleet's rate over its servers; b = min(concurrency, cap), repeats and the points past the cap
averaged) is turned into the step time that gives its measured rate under that model, with the prefill per
prompt token read off the TTFT at the lowest concurrency (where no request waits). So the measured profile
reproduces every measured rate, and `dflash plan --project --profile MEASURED.json` projects from it. A launch-
mode sweep's speculative comparison adds a one-point curve per other setting (MTP off, other chains).

**The comparison.** Per measured point, the decode step measured over the profile's at the same running count
(the profile interpolates between its points), and the decode rate (b x A / step) the same way; the verdict is
the geometric mean of the step ratios against ±15% (the tolerance of the seed anchor). With random weights
(`--load-format dummy`) the accept length means nothing, so the rates are compared at the profile's accept
length (the step ratio alone).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from dagster_project.ops.tune import TunePoint, TuneReport, interpolate
from dagster_project.sglang.profiles.profile import SEED_SPEC, SPEC_OFF, DecodeCurve, GpuProfile, SpecSettings
from dagster_project.sglang.speculative import OFF, parse_setting

TOLERANCE = 0.15  # a profile whose decode steps are within this of the measured ones holds
RANDOM_WEIGHTS = "random weights (--load-format dummy): the accept length means nothing, only step times compare"


@dataclass(frozen=True)
class MeasuredRun:
    """What a GPU run says about itself, beside its sweep."""

    gpu: str = field(metadata={"help": "the GPU, as the profiles name it (h200, b200)"})
    weights: str = field(default="bf16", metadata={"help": "the served weights: bf16 or fp8"})
    memory_gib: float = field(default=0.0, metadata={"help": "the GPU's memory as nvidia-smi shows it, GiB"})
    weights_gib: float = field(default=0.0, metadata={"help": "the loaded weights (/server_info memory_usage.weight)"})
    kv_cache_dtype: str = field(default="auto", metadata={"help": "the servers' KV cache dtype"})
    mamba_ssm_dtype: str = field(default="float32", metadata={"help": "the servers' mamba state dtype"})
    random_weights: bool = field(default=False, metadata={"help": "served with --load-format dummy"})
    source: str = field(default="measured", metadata={"help": "where and when it was measured"})

    @property
    def name(self) -> str:
        return f"{self.gpu}-{self.weights}-measured"


def _spec_of(label: str) -> tuple[SpecSettings, str | None]:
    """The profile's speculative settings for a tune label (`3/1/4`, `off`), and a flag when it had to assume."""
    if label == OFF:
        return SPEC_OFF, None
    try:
        setting = parse_setting(label)
    except ValueError:
        return SEED_SPEC, f"the servers did not report their speculative setting ({label}): assumed 3/1/4"
    assert setting is not None  # `off` is handled above
    return SpecSettings(setting.steps, setting.topk, setting.draft_tokens), None


def measured_profile(report: TuneReport, run: MeasuredRun) -> GpuProfile:
    """The measured curve of `report` (the knee's server setting; in connect mode the only one) in profile form."""
    curve = report.curve()
    if not curve:
        raise ValueError("the sweep measured no point: nothing to write as a profile")
    done = [p for p in curve if p.output_tok_per_s > 0]
    lowest = min(done, key=lambda p: p.concurrency)
    prompt = statistics.fmean(p.mean_prompt_tokens for p in done)
    output = statistics.fmean(p.mean_output_tokens for p in done)
    prefill = (lowest.ttft_p50_s or 0.0) / lowest.mean_prompt_tokens if lowest.mean_prompt_tokens else 0.0
    launched = report.speculative.launched if report.speculative else "unknown"
    spec, assumed = _spec_of(launched)
    flagged = [RANDOM_WEIGHTS] if run.random_weights else []
    flagged += [assumed] if assumed else []
    measured = [(p, *interpolate(curve, p.concurrency)) for p in _distinct(done)]  # repeats averaged
    if any(_per_token(rate / p.servers, p, prefill) <= 0 for p, rate, _ in measured):
        flagged.append(
            f"the TTFT at concurrency {lowest.concurrency} ({(lowest.ttft_p50_s or 0) * 1000:.0f} ms) is more than "
            "the time per output token allows for prefill: prefill not separated, the steps include it"
        )
        prefill = 0.0
    else:
        flagged.append(f"prefill per token from the TTFT p50 at concurrency {lowest.concurrency}")
    steps: dict[int, list[float]] = {}
    accepts: list[float] = []
    for point, rate, accept in measured:
        running = min(point.concurrency, point.cap) if point.cap else point.concurrency
        steps.setdefault(running, []).append(
            running * (accept or 1.0) * _per_token(rate / point.servers, point, prefill)
        )
        accepts += [accept] if accept else []
    curves = [DecodeCurve(spec, statistics.fmean(accepts) if accepts else 1.0, _points(steps))]
    if report.speculative is not None and report.speculative.measured:
        base = next(p for p in done if p.concurrency == max(q.concurrency for q in done))
        for trial in report.speculative.trials:
            if trial.baseline or not trial.ran:
                continue
            other, note = _spec_of(trial.setting)
            running = report.speculative.concurrency
            per_token = _per_token(trial.output_tok_per_s / base.servers, base, prefill)
            step = running * (trial.accept_length or 1.0) * max(per_token, 0.0)
            curves.append(DecodeCurve(other, trial.accept_length or 1.0, ((running, step),)))
            flagged += [note] if note else []
    return GpuProfile(
        name=run.name,
        gpu=run.gpu,
        weights=run.weights,
        kv_cache_dtype=run.kv_cache_dtype,
        mamba_ssm_dtype=run.mamba_ssm_dtype,
        memory_gib=run.memory_gib,
        weights_gib=run.weights_gib,
        prefill_s_per_token=prefill,
        ttft_s=0.0,
        context_tokens=prompt + output / 2,
        curves=tuple(curves),
        source=run.source,
        flagged=tuple(flagged),
    )


def _distinct(points: Sequence[TunePoint]) -> list[TunePoint]:
    """One point per concurrency, by concurrency."""
    return [next(p for p in points if p.concurrency == c) for c in sorted({p.concurrency for p in points})]


def _per_token(rate_per_gpu: float, point: TunePoint, prefill: float) -> float:
    """Seconds of decode per output token at `rate_per_gpu` under the profile's rate model, the prefill of this
    point's prompts taken out: step / (running x accept length)."""
    return 1 / rate_per_gpu - point.mean_prompt_tokens * prefill / max(point.mean_output_tokens, 1.0)


def _points(steps: dict[int, list[float]]) -> tuple[tuple[int, float], ...]:
    return tuple((running, statistics.fmean(values)) for running, values in sorted(steps.items()))


@dataclass(frozen=True)
class PointCheck:
    spec: str
    running: int
    measured_step_s: float
    profile_step_s: float
    measured_rate: float  # decode output tok/s per GPU: running x accept length / step
    profile_rate: float

    @property
    def step_ratio(self) -> float:
        return self.measured_step_s / self.profile_step_s

    @property
    def rate_ratio(self) -> float:
        return self.measured_rate / self.profile_rate


@dataclass(frozen=True)
class ProfileComparison:
    measured: str
    profile: str
    points: list[PointCheck]
    accept_lengths: list[tuple[str, float, float]]  # (spec, measured, profile), where the accept length means something
    caveats: list[str] = field(default_factory=list)
    verdict: str = ""

    def render(self) -> str:
        lines = [f"{self.measured} against profile {self.profile}: {self.verdict}", ""]
        lines.append(f"{'speculative':<16}{'running':>8}{'step (ms)':>11}{'profile':>9}{'ratio':>7}"
                     f"{'decode tok/s':>14}{'profile':>10}{'ratio':>7}")  # fmt: skip
        for p in self.points:
            lines.append(
                f"{p.spec:<16}{p.running:>8}{p.measured_step_s * 1000:>11.2f}{p.profile_step_s * 1000:>9.2f}"
                f"{p.step_ratio:>7.2f}{p.measured_rate:>14,.0f}{p.profile_rate:>10,.0f}{p.rate_ratio:>7.2f}"
            )
        for spec, measured, profile in self.accept_lengths:
            lines.append(f"accept length {spec}: measured {measured:.2f}, profile {profile:.2f}")
        lines += [f"note: {caveat}" for caveat in self.caveats]
        return "\n".join(lines) + "\n"


def compare(measured: GpuProfile, profile: GpuProfile) -> ProfileComparison:
    """Each measured point against the profile's curve of the same speculative setting, and the verdict."""
    random_weights = RANDOM_WEIGHTS in measured.flagged
    caveats = [
        f"{what} differs: measured {mine}, profile {theirs}"
        for what, mine, theirs in (
            ("GPU", measured.gpu, profile.gpu),
            ("weights", measured.weights, profile.weights),
            ("KV cache dtype", measured.kv_cache_dtype, profile.kv_cache_dtype),
            ("mamba state dtype", measured.mamba_ssm_dtype, profile.mamba_ssm_dtype),
        )
        if mine != theirs
    ]
    points, accepts = [], []
    for curve in measured.curves:
        try:
            theirs = profile.curve(curve.spec)
        except KeyError:
            caveats.append(f"the profile has no curve for {curve.spec.label}: not compared")
            continue
        accept = theirs.accept_length if random_weights else curve.accept_length
        if not random_weights:
            accepts.append((curve.spec.label, curve.accept_length, theirs.accept_length))
        for running, step in curve.points:
            expected = theirs.step_s(running)
            points.append(
                PointCheck(
                    curve.spec.label,
                    running,
                    step,
                    expected,
                    running * accept / step,
                    running * theirs.accept_length / expected,
                )
            )
    if random_weights:
        caveats.append(RANDOM_WEIGHTS)
    return ProfileComparison(measured.name, profile.name, points, accepts, caveats, _verdict(points))


def _verdict(points: Sequence[PointCheck]) -> str:
    if not points:
        return "nothing to compare: no measured point has a curve of its speculative setting in the profile"
    ratios = [p.step_ratio for p in points]
    mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
    spread = f"{min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} points"
    outside = [p for p in points if abs(p.step_ratio - 1) > TOLERANCE]
    if not outside:
        return f"the profile holds: measured decode steps {mean:.2f}x its own ({spread}), all within ±{TOLERANCE:.0%}"
    where = ", ".join(f"{p.spec} at {p.running} running ({p.step_ratio:.2f}x)" for p in outside)
    if mean > 1 + TOLERANCE:
        head = f"the profile is optimistic: measured decode steps {mean:.2f}x its own ({spread})"
    elif mean < 1 - TOLERANCE:
        head = f"the profile is pessimistic: measured decode steps {mean:.2f}x its own ({spread})"
    else:
        head = f"the profile's shape differs: decode steps {mean:.2f}x its own on average ({spread})"
    return (
        f"{head}; outside ±{TOLERANCE:.0%}: {where}; project from the measurement instead "
        "(`dflash plan --project --profile MEASURED.json`)"
    )
