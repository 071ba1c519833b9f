"""The GPU profiles against their anchors, and the seed job projected at the seed's and tuned settings.

    python -m benchmarks.bench_profiles

Four roofline profiles of Qwen3.6-27B (H200 and B200, bf16 and FP8 weights; docs/GPU_PROFILES.md has the model
and every constant's source) are set beside the figures they must meet: on B200 the seed run (2,271 output tok/s
per GPU logged over its decode batches, 6.1 answers/s over 7 GPUs end to end) and a public figure (Qwen3.5-27B
FP8, MTP-1, ~11.5K total tok/s per B200 at ISL 1024 / OSL 512); no published figure of this model class on H200
was found. Each profile is also run through the simulator's own rate formula (`sglang.sim.rates`) with the
settings `GpuProfile.sim_options` gives it, which must agree with the profile's own rate; and the B200 bf16 profile
drives a simulator process (`dflash tune --simulate 1`, 16 requests in flight, 600-token prompts, 2,472-token
answers), whose measured output tok/s is set beside the profile's (about 2.5 minutes).

The seed job (913,786 answers x 2,472 output tokens, 7 B200, $27/hour) is projected by `dflash plan --project`'s
code (`ops.projection`), next to the simple alternative an operator reaches for first: throughput that grows with
the batch (the seed's rate x running / 16).

Results go to the `profiles` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.bench_tune import dflash_tune
from benchmarks.report import write_section
from dagster_project.ops.projection import SEED_RUNNING, Job, project
from dagster_project.sglang.profiles import anchors, constants
from dagster_project.sglang.profiles.profile import PROFILES, SEED_SPEC, SPEC_OFF, ProfileSpec, build_profile
from dagster_project.sglang.sim.config import SimConfig
from dagster_project.sglang.sim.rates import steady_output_rate

PROMPT = constants.value("seed.prompt_tokens")
OUTPUT = constants.value("seed.output_tokens")


def anchors_section() -> str:
    lines = [
        "| profile | anchor | profile's figure | anchor's figure | ratio | tolerance |",
        "|---|---|---:|---:|---:|---|",
    ]
    for check in anchors.checks():
        tolerance = "fitted to it" if check.tolerance is None else f"±{check.tolerance:.0%}"
        verdict = "" if check.tolerance is None else (" PASS" if check.within else " **FAIL**")
        note = f" ({check.note})" if check.note else ""
        lines.append(
            f"| {check.profile} | {check.anchor}{note} | {check.predicted:,.0f} | {check.published:,.0f} {check.unit} "
            f"| **{check.ratio:.3f}** | {tolerance}{verdict} |"
        )
    return "\n".join(lines)


def profiles_section() -> str:
    lines = [
        "| profile | weights (GiB) | decode step ms at 1 / 16 / 64 running | decode tok/s at 16 | MTP off at 16 "
        "| prefill of 600 tokens (ms) | most running in memory | knee | simulator at 16 / profile | anchor |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for spec in PROFILES:
        profile = build_profile(spec)
        curve = profile.curve(SEED_SPEC)
        projection = project(Job(profile=profile.name))
        simulated = steady_output_rate(SimConfig(**profile.sim_options(SEED_SPEC)), SEED_RUNNING, OUTPUT)
        decode, off = curve.decode_rate(SEED_RUNNING), profile.curve(SPEC_OFF).decode_rate(SEED_RUNNING)
        steps = " / ".join(f"{curve.step_s(b) * 1000:.1f}" for b in (1, 16, 64))
        anchor = "seed, public figure" if spec.gpu == "b200" else "none published for this model class on H200"
        lines.append(
            f"| {profile.name} | {profile.weights_gib:.1f} | {steps} | {decode:,.0f} "
            f"| {off:,.0f} | {profile.prefill_s_per_token * PROMPT * 1000:.0f} "
            f"| {projection.settings[2].running} | {projection.tuned.running} "
            f"| {simulated * (OUTPUT - 1) / OUTPUT / decode:.3f} | {anchor} |"
        )
    return "\n".join(lines)


def simulator_section() -> str:
    """The B200 bf16 profile's settings in a simulator process, measured at the seed's batch by `dflash tune`."""
    profile = build_profile(ProfileSpec("b200"))
    options = {**profile.sim_options(SEED_SPEC), "output_len": f"fixed:{OUTPUT:.0f}", "max_output_len": int(2 * OUTPUT)}
    with tempfile.TemporaryDirectory() as tmp:
        report = dflash_tune(
            Path(tmp), profile.name, options,
            "--concurrencies", str(SEED_RUNNING), "--refine", "0", "--rounds", "2",
            "--max-new-tokens", f"{2 * OUTPUT:.0f}",
        )  # fmt: skip
    (point,) = report.points
    expected = profile.output_rate(SEED_RUNNING, OUTPUT, PROMPT)
    return (
        f"A simulator process with the {profile.name} profile's settings (`dflash tune --simulate 1`, "
        f"{SEED_RUNNING} requests in flight): **{point.output_tok_per_s:,.0f}** "
        f"output tok/s at accept length {point.accept_length:.2f}, against the profile's {expected:,.0f} "
        f"(ratio **{point.output_tok_per_s / expected:.3f}**) and the seed's {anchors.seed_end_to_end_rate():,.0f} "
        "end to end."
    )


def projection_section(profile: str) -> str:
    projection = project(Job(profile=profile))
    # The simple alternative: the seed setting's hours shrink in proportion to the running requests.
    naive = [
        f"{row.label}: {projection.seed.hours * SEED_RUNNING / row.running:.1f} h" for row in projection.settings[1:]
    ]
    return (
        f"{projection.table()}\n\nTuned flags: `{' '.join(projection.tuned.flags)}`. The simple alternative "
        f"(throughput x running / {SEED_RUNNING}) would promise {'; '.join(naive)}."
    )


def answer() -> str:
    """The "4-8x" question under the profiles, with figures computed here."""
    bf16, fp8 = project(Job(profile="b200-bf16")), project(Job(profile="b200-fp8"))
    seed = bf16.seed
    naive = bf16.tuned.running / SEED_RUNNING
    return (
        f"**Can we 4-8x it?** The batch, yes: memory holds {bf16.settings[2].running} running per B200 with bf16 "
        f"weights ({fp8.settings[2].running} with FP8) against the seed's {SEED_RUNNING}. The throughput, no: "
        "each running request moves its own mamba state (154 MB in fp32, read once and snapshotted per verified "
        "token) and its KV cache every step, which a larger batch does not amortize, so the curve flattens: "
        f"x{bf16.tuned.output_rate / seed.output_rate:.2f} at the knee ({bf16.tuned.running} running, "
        f"{bf16.tuned.hours:.1f} h instead of {seed.hours:.1f} h), x{fp8.tuned.output_rate / seed.output_rate:.2f} "
        f"with FP8 weights ({fp8.tuned.hours:.1f} h). The simple alternative (throughput grows with the batch) "
        f"promises x{naive:.1f} at the same knee, and is what the profile refutes. These rest on the flagged "
        "assumptions above; the first GPU run (`scripts/gpu_check.sh`) replaces them with measurements."
    )


def run(simulate: bool) -> str:
    started = time.perf_counter()
    flagged = [row for row in constants.TABLE if row.flagged]
    body = [
        "## profiles: GPU profiles against their anchors; the seed job projected "
        "(`python -m benchmarks.bench_profiles`)",
        "",
        "Roofline profiles of Qwen3.6-27B (docs/GPU_PROFILES.md: the model, and every constant with its source and "
        "date). Ratios are the profile's figure over the anchor's. Flagged (assumptions and fitted values): "
        + "; ".join(f"`{row.name}` = {row.value:g} {row.unit} ({row.kind.value})" for row in flagged)
        + ".",
        "",
        "### Each profile against its anchors",
        "",
        anchors_section(),
        "",
        "### The four profiles (NEXTN 3/1/4, accept length "
        f"{constants.value('seed.accept_length')}, FP8 KV cache, fp32 SSM state; {PROMPT:.0f}-token prompts, "
        f"{OUTPUT:,.0f}-token answers)",
        "",
        profiles_section(),
        "",
        "*Simulator at 16 / profile*: the simulator's closed-form rate (`sglang.sim.rates`) with the profile's "
        "`sim_options` (its curve fitted as a line over 1-64 running), over the profile's decode rate.",
        "",
        simulator_section() if simulate else "(simulator process not run: `--no-simulator`)",
        "",
        "### The seed job projected (`dflash plan --project`)",
        "",
        projection_section("b200-bf16"),
        "",
        "With FP8 weights (`--profile b200-fp8`):",
        "",
        projection_section("b200-fp8"),
        "",
        answer(),
        "",
        f"* Wall time {time.perf_counter() - started:.1f} s.",
    ]
    return "\n".join(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--no-simulator",
        action="store_true",
        help="skip the simulator process (2.5 minutes); BENCHMARKS.md not written",
    )
    skip = parser.parse_args().no_simulator
    markdown = run(not skip)
    print(markdown)
    if not skip:
        print(f"\nwritten to {write_section('profiles', markdown)}")


if __name__ == "__main__":
    main()
