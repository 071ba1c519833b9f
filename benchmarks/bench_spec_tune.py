"""Does MTP pay at the concurrency the fleet runs? `dflash tune`'s speculative comparison on the B200 profile.

    python -m benchmarks.bench_spec_tune

A simulator process driven by the b200-bf16 GPU profile (`GpuProfile.sim_options`: its 3/1/4 step curve, memory
and accept length; the simulator prices MTP off and the other chains from that step, fitted to the profile's
roofline) is tuned by `dflash tune --simulate 1` at the seed's 16 requests in flight and at 64, with the
speculative grid off, 1/1/2, 2/1/3, 4/1/5 measured against the 3/1/4 it launched with (600-token prompts,
400-token answers; about 4 minutes). Each measured rate is set beside the profile's own curve for that setting
(`DecodeCurve.decode_rate`, and `GpuProfile.output_rate` with prefill stalling decoding), and the measured gain
of MTP beside the simple assumption an operator starts from: MTP multiplies throughput by its accept length.

Results go to the `spec-tune` section of BENCHMARKS.md.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.bench_tune import dflash_tune
from benchmarks.report import write_section
from dagster_project.sglang.profiles.profile import SEED_SPEC, SPEC_OFF, SpecSettings, profile_named
from dagster_project.sglang.speculative import parse_setting

PROFILE = "b200-bf16"
PROMPT, OUTPUT = 600, 400
GRID = "off,1/1/2,2/1/3,4/1/5"
RUNNING = (16, 64)


def _spec(label: str) -> SpecSettings:
    setting = parse_setting(label)
    return SPEC_OFF if setting is None else SpecSettings(setting.steps, setting.topk, setting.draft_tokens)


def run() -> str:
    profile = profile_named(PROFILE)
    options = {**profile.sim_options(SEED_SPEC), "output_len": f"fixed:{OUTPUT}", "enable_metrics": True}
    lines = [
        f"`dflash tune --simulate 1` on the {PROFILE} profile's simulator, {PROMPT}-token prompts, {OUTPUT}-token "
        "answers; each speculative setting relaunched (sized as any launch) and measured at that concurrency (one "
        "point each). *Profile*: the profile's own curve for that setting, its decode batches alone and with every "
        "prefill stalling decoding (the simulator prefills a request without stalling the others, so it sits "
        "between the two); *accept-length assumption*: MTP multiplies throughput by its accept length (no draft "
        "or verify cost).",
        "",
        "| running | setting | measured output tok/s | profile: decode only / with prefill stalls "
        "| measured / profile decode | accept length | gain over MTP off: measured | accept-length assumption |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for running in RUNNING:
            report = dflash_tune(
                Path(tmp), f"running-{running}", options,
                "--concurrencies", str(running), "--refine", "0", "--rounds", "2", "--max-new-tokens", str(OUTPUT),
                "--spec-settings", GRID,
            )  # fmt: skip
            comparison = report.speculative
            assert comparison is not None and comparison.measured, "the launch-mode tune compared no setting"
            off = next(t for t in comparison.trials if t.setting == "off")
            for trial in comparison.trials:
                spec = _spec(trial.setting)
                stalled = profile.output_rate(comparison.concurrency, OUTPUT, PROMPT, spec)
                expected = profile.curve(spec).decode_rate(comparison.concurrency)
                accept = trial.accept_length or 1.0
                measured_gain = trial.output_tok_per_s / off.output_tok_per_s - 1
                name = f"{trial.setting} (as launched)" if trial.baseline else trial.setting
                lines.append(
                    f"| {comparison.concurrency} | {name} | {trial.output_tok_per_s:,.0f} "
                    f"| {expected:,.0f} / {stalled:,.0f} "
                    f"| {trial.output_tok_per_s / expected:.3f} | {accept:.2f} | "
                    + ("— |" if trial is off else f"**{measured_gain:+.0%}** |")
                    + ("— |" if trial is off else f" {accept - 1:+.0%} |")
                )
            verdicts.append(f"* at {comparison.concurrency} running: {comparison.verdict}")
    minutes = (time.monotonic() - started) / 60
    lines += ["", "The verdict `dflash tune` printed:", "", *verdicts, "", f"({minutes:.1f} minutes.)"]
    return "\n".join(lines)


def main() -> None:
    body = run()
    print(body)
    write_section("spec-tune", "## MTP on vs off at the recommended concurrency (`dflash tune`)\n\n" + body)


if __name__ == "__main__":
    main()
