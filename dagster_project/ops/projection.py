"""`dflash plan --project`: the whole job projected from a GPU profile, at the seed's launch settings and tuned ones.

A job is its events, the mean output and prompt tokens of an answer, the GPUs (one server each) and their profile,
and the price of a GPU-hour. Each setting keeps a number of requests running per GPU; the profile turns it into
output tok/s per GPU (decode steps at that batch with their accept length, plus each request's prefill), and the
job takes events x output tokens / (GPUs x that rate):

- **seed**: the seed run's launch, 16 running per GPU (the cap its servers chose from memory; 48 client requests
  per server kept the rest queued), NEXTN 3/1/4;
- **tuned (knee)**: the knee of the profile's curve (`ops.knee`: the least running count within `dflash tune`'s
  knee fraction of the best rate) up to the most the GPU's memory holds at this request length
  (`sglang.capacity.plan_for_gpu`, radix cache off);
- **memory cap**: that most, for what the last few percent cost in requests held.

What binds says why a setting cannot go faster: the cap, the curve flattening (per-request memory traffic, which a
larger batch does not amortize), or the KV/mamba pools.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dagster_project.ops import knee
from dagster_project.sglang.profiles import constants
from dagster_project.sglang.profiles.profile import SEED_SPEC, GpuProfile, SpecSettings, profile_named

_c = constants.value
SEED_RUNNING = int(_c("seed.running"))
KNEE_FRACTION = 0.95  # `dflash tune`'s default (TuneOptions.knee_fraction)


@dataclass(frozen=True)
class Job:
    events: int = field(default=int(_c("seed.events")), metadata={"help": "Answers to generate (prompts)."})
    output_tokens: float = field(default=_c("seed.output_tokens"), metadata={"help": "Mean output tokens per answer."})
    prompt_tokens: float = field(default=_c("seed.prompt_tokens"), metadata={"help": "Mean prompt tokens."})
    gpus: int = field(default=int(_c("seed.gpus")), metadata={"help": "GPUs, one server each."})
    profile: str = field(
        default="b200-bf16",
        metadata={"help": "GPU type and weights: h200-bf16, h200-fp8, b200-bf16, b200-fp8, or a profile JSON file."},
    )
    cost_per_gpu_hour: float = field(
        default=round(_c("seed.cost_per_hour") / _c("seed.gpus"), 4),
        metadata={"help": "US$ per GPU-hour (the seed's node: $27/hour for 7 GPUs)."},
    )

    def __post_init__(self) -> None:
        if self.events < 1 or self.gpus < 1 or self.output_tokens < 1 or self.prompt_tokens < 0:
            raise ValueError("a job needs events, GPUs and output tokens >= 1, prompt tokens >= 0")


@dataclass(frozen=True)
class ProjectedSetting:
    label: str
    running: int  # per GPU
    spec: SpecSettings
    accept_length: float
    output_rate: float  # output tok/s per GPU
    hours: float
    cost: float
    binds: str
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Projection:
    job: Job
    profile: GpuProfile
    settings: tuple[ProjectedSetting, ...]

    @property
    def seed(self) -> ProjectedSetting:
        return self.settings[0]

    @property
    def tuned(self) -> ProjectedSetting:
        return self.settings[1]

    def table(self) -> str:
        job = self.job
        lines = [
            f"{job.events:,} answers x {job.output_tokens:,.0f} output tokens ({job.prompt_tokens:,.0f}-token "
            f"prompts) on {job.gpus} x {self.profile.name} at ${job.cost_per_gpu_hour:,.2f}/GPU-hour",
            "",
            "| setting | running per GPU | speculative | accept length | output tok/s per GPU | job hours | job cost "
            "| x seed | what binds |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in self.settings:
            lines.append(
                f"| {row.label} | {row.running} | {row.spec.label} | {row.accept_length:.2f} | {row.output_rate:,.0f} "
                f"| {row.hours:,.1f} | ${row.cost:,.0f} | x{row.output_rate / self.seed.output_rate:.2f} "
                f"| {row.binds} |"
            )
        return "\n".join(lines)

    @property
    def memory_cap(self) -> ProjectedSetting:
        return self.settings[2]

    def in_words(self) -> str:
        """The answer as a sentence: how far the batch can grow, how far the throughput follows, and why."""
        seed, tuned, most = self.seed, self.tuned, self.memory_cap
        speedup = tuned.output_rate / seed.output_rate
        if tuned.running < most.running:
            why = (
                f"because past {tuned.running} running every request brings its own memory traffic per step (its "
                "mamba state and KV cache), which a larger batch does not share"
            )
        else:
            why = f"because memory holds no more than {most.running} running requests at this length"
        return (
            f"The batch can grow about {most.running / seed.running:.0f}× ({most.running} running requests per GPU "
            f"fit in memory against the seed's {seed.running}); throughput about {speedup:.1f}× (x{speedup:.2f} at "
            f"{tuned.running} running: {tuned.hours:,.1f} h instead of {seed.hours:,.1f} h, ${tuned.cost:,.0f} "
            f"instead of ${seed.cost:,.0f}), {why}."
        )

    def describe(self) -> str:
        flags = " ".join(self.tuned.flags)
        assumptions = "; ".join(self.profile.flagged)
        return (
            f"{self.in_words()}\n\n{self.table()}\n\ntuned launch flags: `{flags}`\n"
            f"profile: {self.profile.source}\nassumptions (flagged): {assumptions}"
        )


def load_profile(job: Job) -> GpuProfile:
    """The job's profile: a profile JSON file as measured (e.g. by scripts/gpu_check.sh), or a built-in one computed
    at the job's mean decode context (its prompt and half its answer)."""
    if job.profile.endswith(".json"):
        return GpuProfile.load(Path(job.profile))
    return profile_named(job.profile, context_tokens=job.prompt_tokens + job.output_tokens / 2)


def project(job: Job, profile: GpuProfile | None = None, spec: SpecSettings = SEED_SPEC) -> Projection:
    profile = profile or load_profile(job)
    curve = profile.curve(spec)

    def setting(label: str, running: int, binds: str, flags: tuple[str, ...] = ()) -> ProjectedSetting:
        rate = profile.output_rate(running, job.output_tokens, job.prompt_tokens, spec)
        hours = job.events * job.output_tokens / (job.gpus * rate) / 3600
        cost = hours * job.gpus * job.cost_per_gpu_hour
        return ProjectedSetting(label, running, spec, curve.accept_length, rate, hours, cost, binds, flags)

    seed = setting(
        "seed launch",
        SEED_RUNNING,
        f"the servers' cap of {SEED_RUNNING} running (chosen from memory at the seed's flags; the other client "
        "requests queue)",
    )
    plan = profile.capacity_plan(job.prompt_tokens + job.output_tokens + spec.draft_tokens, spec)
    most = plan.concurrency
    samples = [(b, profile.output_rate(b, job.output_tokens, job.prompt_tokens, spec)) for b in range(1, most + 1)]
    estimate = knee.estimate_knee(samples, most, KNEE_FRACTION, replicates=0)
    assert estimate is not None  # every sample has a positive rate
    memory = f"memory: {plan.describe()}"
    at_knee = estimate.concurrency
    flattening = (
        f"the curve: past {at_knee} running, more requests add under {1 - KNEE_FRACTION:.0%} "
        "(each brings its own mamba state and KV traffic per step)"
    )
    tuned = setting(
        "tuned (knee)",
        at_knee,
        flattening if at_knee < most else memory,
        _with_cap(plan.flags, at_knee),
    )
    return Projection(job, profile, (seed, tuned, setting("memory cap", most, memory, plan.flags)))


def _with_cap(flags: tuple[str, ...], running: int) -> tuple[str, ...]:
    """The plan's flags with `--max-running-requests` set to `running`."""
    out = list(flags)
    if "--max-running-requests" in out:
        out[out.index("--max-running-requests") + 1] = str(running)
    else:
        out += ["--max-running-requests", str(running)]
    return tuple(out)
