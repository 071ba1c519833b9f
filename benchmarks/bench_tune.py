"""`dflash tune` against a simulator with a known optimum, and the throughput at the launch defaults.

    python -m benchmarks.bench_tune [--quick | --shapes]

One simulated H200 (`gpu_memory_gb` 139.4, the automatic memory fraction 0.824): its pools and running cap are
sized from memory as SGLang 0.5.23 sizes them. Its curves: a decode step of 5 ms for a batch of one that grows
2% per extra running request (`decode_step_growth`), and MTP acceptance (P(k drafts accepted) = 0.1, 0.1, 0.2,
0.6: 3.3 tokens per verify pass alone) that falls with the batch (`accept_decay_batch` 200: 3.1 at 22 running,
2.7 at 69, the figures of issue 11's example). Requests: synthetic 600-token prompts, answers of 300-500
tokens, `max_new_tokens` 512.

Three launches, each measured by `dflash tune` in launch mode (a subprocess, as an operator runs it):

1. **SGLang's own sizing** (what `fleet up` launched before: radix cache on, `--max-running-requests` left at
   the speculative default 48): the mamba state pool caps it at 22; measured at the dispatcher's window,
   ceil(22 x 1.25) = 28 in flight.
2. **The ceiling** (`fleet up`'s default now: radix cache off, `--max-running-requests` planned from the
   memory for 2.6K-token requests: 69): the full sweep, the knee and the recommendation.
3. The ceiling with a **bf16 SSM state** (a numerics change, never the default): 116, at its window.

The true knee is computed analytically from the simulator's model (`sglang.sim.rates`): with B running, a
request of L tokens takes `ttft + (L - 1) / a(B) x step x (1 + growth x (B - 1))`, where a(B) is the accept
length at B (the simulator's 32 acceptance levels), so the server's rate is `B x L / that`; past the cap the
batch stays at the cap. The knee is the least concurrency reaching 95% of the best rate over 1..1.25 x cap
(`ops.knee` defines it). Acceptance: the tuner's recommended concurrency within 10% of it.

**Curve shapes** (`--shapes`, seconds): the tuner's own sweep logic (`tune.sweep_points`: coarse points, the
estimated knee, repeats, the fit) on four step-time curves measured through the simulator's formula with ±3%
uniform noise per point, over many seeds, against the rule it replaced (95% of the best measured point, bisected
between neighbours) on the same noisy draws.

Results go to the `tune` and `tune-shapes` sections of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import write_section
from dagster_project.ops import knee as knee_fit
from dagster_project.ops import tune
from dagster_project.ops.tune import TuneOptions, TuneReport
from dagster_project.ops.tune_point import TunePoint
from dagster_project.sglang.launch_plan import CapacityTarget, plan_simulators
from dagster_project.sglang.sim.config import SimConfig
from dagster_project.sglang.sim.rates import steady_output_rate
from dagster_project.store.dataclass_json import from_json

H200 = {"gpu_memory_gb": 139.4, "mem_fraction_static": 0.824}
CURVES = {
    "decode_step_s": 0.005,
    "decode_step_growth": 0.02,
    "accept_probs": [0.1, 0.1, 0.2, 0.6],
    "accept_decay_batch": 200,
    "ttft_s": 0.02,
    "output_len": "uniform:300:500",
    "enable_metrics": True,
}
MEAN_OUTPUT = 400  # uniform:300:500
PROMPT_TOKENS = 600
MAX_NEW_TOKENS = 512
KNEE_FRACTION = 0.95
TOLERANCE = 0.10
OVERSUBSCRIPTION = 1.25  # the dispatcher's window over the cap (DispatchOptions)


def true_rate(concurrency: int, cap: int) -> float:
    """Output tokens/s of the server with `concurrency` requests in flight, from the simulator's model."""
    return steady_output_rate(SimConfig(**CURVES, max_running_requests=cap), concurrency, MEAN_OUTPUT)


def true_knee(config: SimConfig, output_tokens: float = MEAN_OUTPUT) -> tuple[int, float, int]:
    """(knee, best rate, where the best is) over client concurrencies 1..1.25 x cap, from the simulator's model."""
    top = math.ceil(config.running_cap * OVERSUBSCRIPTION)
    rates = {c: steady_output_rate(config, c, output_tokens) for c in range(1, top + 1)}
    best = max(rates.values())
    return min(c for c, rate in rates.items() if rate >= KNEE_FRACTION * best), best, max(rates, key=rates.get)


# ---- curve shapes: the knee fit against noise -----------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    name: str
    what: str
    config: SimConfig


_MTP = {"accept_probs": (0.1, 0.1, 0.2, 0.6), "ttft_s": 0.02}
SHAPES = (
    Shape(
        "steep",
        "2 ms step growing 30% per extra request, cap 64",
        SimConfig(decode_step_s=0.002, decode_step_growth=0.3, max_running_requests=64, **_MTP),
    ),
    Shape(
        "flat",
        "5 ms step, no growth, cap 40",
        SimConfig(decode_step_s=0.005, decode_step_growth=0.0, max_running_requests=40, **_MTP),
    ),
    Shape(
        "knee near the cap",
        "5 ms step growing 2%, acceptance halving at 200 running, cap 69",
        SimConfig(
            decode_step_s=0.005, decode_step_growth=0.02, accept_decay_batch=200, max_running_requests=69, **_MTP
        ),
    ),
    Shape(
        "knee far below the cap",
        "5 ms step growing 10%, acceptance halving at 200 running, cap 256",
        SimConfig(
            decode_step_s=0.005, decode_step_growth=0.1, accept_decay_batch=200, max_running_requests=256, **_MTP
        ),
    ),
)
# Beyond the model's reach (reported, not part of the acceptance): acceptance halving at 24 running makes the
# curve peak at 50 and fall, a shape the saturating fit only approximates.
PEAKED = Shape(
    "peaked (acceptance halving at 24 running)",
    "5 ms step growing 5%, acceptance halving at 24 running, cap 160",
    SimConfig(decode_step_s=0.005, decode_step_growth=0.05, accept_decay_batch=24, max_running_requests=160, **_MTP),
)
NOISE = 0.03


def noisy_measure(config: SimConfig, rng: random.Random, noise: float = NOISE) -> Callable[[int], TunePoint]:
    """One point of a sweep: the simulator's rate at that concurrency, times 1 ± `noise` (uniform)."""

    def measure(concurrency: int) -> TunePoint:
        rate = steady_output_rate(config, concurrency, MEAN_OUTPUT) * (1 + rng.uniform(-noise, noise))
        return TunePoint("sim", concurrency, config.running_cap, 1, 0, 0, rate, 0.0, *[None] * 5, 0, MEAN_OUTPUT, 0)

    return measure


def fitted_knee(config: SimConfig, seed: int) -> knee_fit.KneeEstimate:
    """What `dflash tune`'s sweep logic recommends on this curve under seeded noise."""
    options = TuneOptions()
    points = tune.sweep_points("sim", config.running_cap, options, noisy_measure(config, random.Random(seed)))
    estimate, _ = tune.choose_knee(points, options.knee_fraction)
    assert estimate is not None
    return estimate


def best_point_knee(config: SimConfig, seed: int, refine: int = 3) -> int:
    """The rule the fit replaced: the least measured concurrency within 95% of the best measured point, narrowed
    by bisection between it and the point below."""
    measure = noisy_measure(config, random.Random(seed))
    rates = {c: measure(c).output_tok_per_s for c in tune.coarse_concurrencies(config.running_cap)}

    def knee() -> int:
        best = max(rates.values())
        return min(c for c, rate in rates.items() if rate >= KNEE_FRACTION * best)

    for _ in range(refine):
        below = [c for c in rates if c < knee()]
        if not below or knee() - max(below) <= max(1, 0.05 * knee()):
            break
        probe = (max(below) + knee()) // 2
        rates[probe] = measure(probe).output_tok_per_s
    return knee()


def shapes_section(seeds: int) -> str:
    started = time.monotonic()
    lines = [
        "## tune-shapes: the knee on four curve shapes under ±3% noise (`python -m benchmarks.bench_tune --shapes`)",
        "",
        "Each row: the simulator's step-time model (`sglang.sim.rates`) measured through `dflash tune`'s own sweep "
        "logic (`tune.sweep_points`: coarse points, the estimated knee, repeats of the points the knee depends "
        f"on, the fitted saturating curve), each point times 1 ± {NOISE:.0%} (uniform), over {seeds} seeds. "
        "*True knee*: the least concurrency within 95% of the model's best over 1..1.25 x cap (`ops.knee` "
        "defines it). *Recommended*: the median over seeds; *error*: median and worst; *interval*: the median of "
        "the 80% bootstrap interval the tuner prints; *old rule*: 95% of the best measured point, bisected, on "
        "the same noisy draws.",
        "",
        "| shape | curve | true knee | recommended (median) | error median / worst | within 10% | interval (median) "
        "| points | old rule: within 10% / worst |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for shape in (*SHAPES, PEAKED):
        truth = true_knee(shape.config)[0]
        estimates = [fitted_knee(shape.config, seed) for seed in range(seeds)]
        errors = [(e.concurrency - truth) / truth for e in estimates]
        old = [(best_point_knee(shape.config, seed) - truth) / truth for seed in range(seeds)]
        within = sum(abs(e) <= TOLERANCE for e in errors)
        middle = sorted(estimates, key=lambda e: e.relative_width)[len(estimates) // 2]
        lines.append(
            f"| {shape.name} | {shape.what} | {truth} | {statistics.median_low([e.concurrency for e in estimates])} "
            f"| {statistics.median(errors):+.1%} / {max(errors, key=abs):+.1%} | **{within}/{seeds}** "
            f"| {middle.low}-{middle.high} | {statistics.fmean(e.points for e in estimates):.1f} "
            f"| {sum(abs(e) <= TOLERANCE for e in old)}/{seeds} / {max(old, key=abs):+.1%} |"
        )
    lines += [
        "",
        "* The interval is the spread the measurement noise gives the fitted knee; it does not cover a bias of the "
        "model itself: where acceptance falls with the batch in the simulator's 32 steps the saturating curve is "
        "off by a few percent (knee near the cap: 60 for 58, inside the 10% but outside the interval), and a curve "
        "that peaks and falls steeply (the last row, not one of the four) is beyond it: +19%, where the old rule "
        "is right more often but off by up to +54%.",
        f"* Wall time {time.monotonic() - started:.0f} s.",
    ]
    return "\n".join(lines)


def dflash_tune(workdir: Path, name: str, sim_options: dict, *extra: str) -> TuneReport:
    """`dflash tune --simulate 1` with these simulator options; the report it wrote. The speculative settings are
    compared only where `extra` asks (`--spec-settings`): the concurrency curve is what these benchmarks measure."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_", "SGLANG_", "DAGSTER_"))},
        "DFLASH_STORE": str(workdir / "store"),
        "DFLASH_WORK_DIR": str(workdir / "work"),
    }
    options = [f"--sim-option={key}={json.dumps(value)}" for key, value in sim_options.items()]
    out = workdir / name
    command = [
        sys.executable, "-m", "dagster_project.cli", "tune", "--simulate", "1", *options,
        "--synthetic-prompt-tokens", str(PROMPT_TOKENS), "--sample", "256", "--max-new-tokens", str(MAX_NEW_TOKENS),
        "--knee-fraction", str(KNEE_FRACTION), "--spec-settings", "", *extra, "--out", str(out),
    ]  # fmt: skip
    print(f"\n$ dflash tune [{name}] {' '.join(extra)}", flush=True)
    subprocess.run(command, env=env, check=True)
    return from_json(TuneReport, (out / "report.json").read_bytes())


def run(quick: bool) -> str:
    rounds = ["--rounds", "4" if quick else "6"]
    target = CapacityTarget()
    _, defaults_plan = plan_simulators({**H200, **CURVES, "max_running_requests": 48}, target)
    _, ceiling_plan = plan_simulators({**H200, **CURVES}, target)
    _, bf16_plan = plan_simulators({**H200, **CURVES, "mamba_ssm_dtype": "bfloat16"}, target)
    caps = {"defaults": defaults_plan.cap, "ceiling": ceiling_plan.cap, "bf16": bf16_plan.cap}
    windows = {name: math.ceil(cap * OVERSUBSCRIPTION) for name, cap in caps.items()}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        defaults = dflash_tune(
            work, "defaults", {**H200, **CURVES, "max_running_requests": 48},
            "--concurrencies", str(windows["defaults"]), "--refine", "0", *rounds,
        )  # fmt: skip
        ceiling = dflash_tune(work, "ceiling", {**H200, **CURVES}, *rounds, "--refine", "2" if quick else "4")
        bf16 = dflash_tune(
            work, "bf16", {**H200, **CURVES, "mamba_ssm_dtype": "bfloat16"},
            "--concurrencies", str(windows["bf16"]), "--refine", "0", *rounds,
        )  # fmt: skip
    elapsed = time.monotonic() - started

    knee, best, best_at = true_knee(SimConfig(**CURVES, max_running_requests=caps["ceiling"]))
    fitted = ceiling.knee_estimate
    found = fitted.concurrency
    error = abs(found - knee) / knee
    verdict = "PASS" if error <= TOLERANCE else "FAIL"
    at_window = next(p for p in ceiling.points if p.concurrency == windows["ceiling"])
    base = defaults.points[0]

    def row(label: str, cap: int, point, note: str = "") -> str:
        return (
            f"| {label} | {cap} | {point.concurrency} | **{point.output_tok_per_s:,.0f}** | "
            f"{true_rate(point.concurrency, cap):,.0f} | {point.accept_length:.2f} | {point.latency_p50_s:.2f} | "
            f"**x{point.output_tok_per_s / base.output_tok_per_s:.2f}**{note} |"
        )

    estimate = next(iter(defaults.capacity.values()))  # what `status` says of the defaults, at these lengths
    curve = " ".join(f"{p.concurrency}:{p.output_tok_per_s:,.0f}" for p in ceiling.points)
    lines = [
        "## tune: the knee `dflash tune` finds; throughput at the launch defaults (`python -m benchmarks.bench_tune`)",
        "",
        "One simulated H200 (memory model on: pools and cap sized from 139.4 GiB free as 0.5.23 sizes them), decode "
        "step 5 ms at batch 1 growing 2% per extra running request, MTP accept length 3.3 alone falling with the "
        "batch (3.1 at 22, 2.7 at 69); synthetic 600-token prompts, 300-500-token answers. Each row is `dflash tune "
        "--simulate 1` in launch mode; *model* is the simulator's own rate at that concurrency, computed "
        "analytically (the bench's docstring has the formula).",
        "",
        "| launch | cap | in flight per server | output tok/s | model | accept length | latency p50 (s) | x defaults |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        row(
            "SGLang's own sizing (the old `fleet up`): radix cache on, 48 asked, the state pool caps it",
            caps["defaults"],
            base,
        ),
        row(
            "**the ceiling** (`fleet up` now): radix cache off, `--max-running-requests` planned",
            caps["ceiling"],
            at_window,
        ),
        row(
            f"the ceiling at the knee `dflash tune` found ({KNEE_FRACTION:.0%} of the fitted best)",
            caps["ceiling"],
            ceiling.knee,
        ),
        row("the ceiling with a bf16 SSM state (a numerics change: not a default)", caps["bf16"], bf16.points[0]),
        "",
        f"**Knee: `dflash tune` recommends {found} requests per server (80% interval {fitted.low}-"
        f"{fitted.high}); the true knee is {knee}** (the least "
        f"concurrency within {KNEE_FRACTION:.0%} of the model's best, {best:,.0f} tok/s at {best_at}, computed "
        f"analytically from the simulator's step-time and accept-length curves and its cap): off by "
        f"{error:.1%}, within {TOLERANCE:.0%}: **{verdict}**. Recommended flags: "
        f"`{' '.join(ceiling.recommended_flags)}`.",
        "",
        f"* The sweep (concurrency: output tok/s): {curve}.",
        f'* **The "4-8x" answer, under these curves: x{at_window.output_tok_per_s / base.output_tok_per_s:.1f} '
        f"from launching at the ceiling** (x{ceiling.knee.output_tok_per_s / base.output_tok_per_s:.1f} at the knee, "
        f"x{bf16.points[0].output_tok_per_s / base.output_tok_per_s:.1f} with a bf16 state), not 4-8x. The capacity "
        f'model\'s estimate for the defaults, "{estimate}", is the concurrency ratio at the same step '
        "time; the step slows with the batch and acceptance falls with it, and that is what the sweep measures. "
        "These are the simulator's curves, made up to be plausible, not measured on an H200: `scripts/gpu_check.sh` "
        "measures the real ones.",
        f"* Wall time {elapsed:.0f} s for the three `dflash tune` runs.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per point; BENCHMARKS.md not written")
    parser.add_argument("--shapes", action="store_true", help="only the knee fit on four curve shapes (seconds)")
    parser.add_argument("--seeds", type=int, default=20, help="noise seeds per shape (--shapes)")
    args = parser.parse_args()
    if args.shapes:
        markdown = shapes_section(args.seeds)
        print("\n" + markdown)
        print(f"\nwritten to {write_section('tune-shapes', markdown)}")
        return
    markdown = run(args.quick)
    print("\n" + markdown)
    if not args.quick:
        print(f"\nwritten to {write_section('tune', markdown)}")


if __name__ == "__main__":
    main()
