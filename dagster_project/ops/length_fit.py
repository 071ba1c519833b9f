"""What `max_new_tokens: fit` saves: the job's output tokens, hours and dollars with the cap at `max_new_tokens`
against the cap fitted to the trainer's `max_length`, from a distribution of the answers' natural lengths.

A trainer cuts every row at `max_length` (4,096 for SpecForge, Model-Optimizer's DFlash trainer and DeepSpec).
Under a plain cap an answer is generated up to `max_new_tokens` and the trainer then drops what lies past
`max_length` − its prompt; under `fit` it is generated only up to there. Per answer of natural length L and a prompt
of P tokens: generated = min(L, max_new_tokens) against min(L, max_new_tokens, max_length − P); trained is the
latter either way. The prompt is the job's mean prompt (`Job.prompt_tokens`); the lengths are a configured
distribution (the simulator's `output_len` syntax) or a pilot's measured lengths (`LengthSample.measured`), and the
projection says which it used.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from dagster_project.ops.projection import Job, Projection, project
from dagster_project.sglang.sim.outputs import parse_length_distribution

# The seed run's answers, assumed lognormal around their 2,472-token mean with σ 0.8 (median
# 2,472 / e^(0.8²/2) = 1,795).
DEFAULT_OUTPUT_LEN = "lognormal:1795:0.8"
DEFAULT_MAX_NEW_TOKENS = 32768
DEFAULT_MAX_LENGTH = 4096
_DRAWS = 200_000  # a configured distribution's sample: its means within ~0.3% at σ 0.8


@dataclass(frozen=True)
class FitOptions:
    """The length distribution and the two caps `dflash plan --project` compares."""

    output_len: str = field(
        default=DEFAULT_OUTPUT_LEN,
        metadata={
            "help": "the answers' natural lengths, as the simulator's output_len: fixed:N, uniform:A:B or "
            "lognormal:MEDIAN:SIGMA (default: the seed run's 2,472-token mean answer at sigma 0.8)"
        },
    )
    max_new_tokens: int = field(default=DEFAULT_MAX_NEW_TOKENS, metadata={"help": "the plain cap compared with fit"})
    max_length: int = field(default=DEFAULT_MAX_LENGTH, metadata={"help": "the trainer's sequence length"})


@dataclass(frozen=True)
class LengthSample:
    """Natural answer lengths, and where they come from (said beside every figure made from them)."""

    lengths: tuple[int, ...]
    source: str

    @classmethod
    def configured(cls, spec: str, draws: int = _DRAWS, seed: int = 0) -> LengthSample:
        sample = parse_length_distribution(spec)
        rng = random.Random(seed)
        return cls(tuple(sample(rng) for _ in range(draws)), f"configured {spec} ({draws:,} draws)")

    @classmethod
    def measured(cls, lengths: list[int], source: str) -> LengthSample:
        """A pilot's answers as they ended (uncapped, or capped well past max_length)."""
        if not lengths:
            raise ValueError(f"no measured answer lengths in {source}")
        return cls(tuple(lengths), f"measured: {source} ({len(lengths):,} answers)")

    def mean_capped(self, cap: float) -> float:
        return sum(min(length, cap) for length in self.lengths) / len(self.lengths)


@dataclass(frozen=True)
class CapOutcome:
    """Per answer, under one cap: output tokens generated and those a trainer at max_length keeps."""

    label: str
    generated: float
    trained: float

    @property
    def cut_share(self) -> float:
        """The share of generated tokens the trainer cuts."""
        return 1 - self.trained / self.generated if self.generated else 0.0


def compare_caps(sample: LengthSample, options: FitOptions, prompt_tokens: float) -> tuple[CapOutcome, CapOutcome]:
    """(max_new_tokens, fit): what each generates per answer and what a trainer at max_length keeps of it."""
    room = max(options.max_length - prompt_tokens, 0)
    plain = sample.mean_capped(options.max_new_tokens)
    fitted = sample.mean_capped(min(options.max_new_tokens, room))
    return (
        CapOutcome(f"max_new_tokens {options.max_new_tokens:,}", plain, fitted),
        CapOutcome(f"fit (max_length {options.max_length:,})", fitted, fitted),
    )


@dataclass(frozen=True)
class FitProjection:
    """The job projected under each cap (`ops.projection`, at the seed's launch and tuned), and the lengths used."""

    source: str
    rows: tuple[tuple[CapOutcome, Projection], ...]

    def table(self) -> str:
        lines = [
            f"max_new_tokens against fit, answer lengths {self.source}:",
            "",
            "| cap | output tokens per answer | cut by a trainer at max_length | seed launch hours | $ "
            "| tuned hours | $ |",
            "|---|---|---|---|---|---|---|",
        ]
        for outcome, projected in self.rows:
            seed, tuned = projected.seed, projected.tuned
            lines.append(
                f"| {outcome.label} | {outcome.generated:,.0f} | {outcome.cut_share:.1%} | {seed.hours:,.1f} "
                f"| ${seed.cost:,.0f} | {tuned.hours:,.1f} | ${tuned.cost:,.0f} |"
            )
        return "\n".join(lines)


def project_caps(job: Job, options: FitOptions, sample: LengthSample) -> FitProjection:
    """The job under each cap: its answers as long as the cap leaves them (the rest of the job as given)."""
    outcomes = compare_caps(sample, options, job.prompt_tokens)
    return FitProjection(
        sample.source,
        tuple((outcome, project(replace(job, output_tokens=max(outcome.generated, 1.0)))) for outcome in outcomes),
    )
