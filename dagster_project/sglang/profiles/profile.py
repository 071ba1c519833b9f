"""A GPU profile: what one SGLang server of Qwen3.6-27B does on one GPU, in one JSON file.

The format (`GpuProfile`, version `FORMAT`) is shared by the profiles built from the roofline (`build_profile`)
and by measured ones (`scripts/gpu_check.sh` writes its curve in it), so a measurement replaces an assumption
field for field:

- `curves`: per speculative setting (`SpecSettings`; steps 0 = off), the accept length and the decode step time
  at each number of running requests (`(running, seconds)` points, interpolated linearly between them);
- `prefill_s_per_token` and `ttft_s`: the prefill model (a prompt of n tokens costs `ttft_s + n x
  prefill_s_per_token` of GPU time, which stalls decoding);
- `memory_gib`, `weights_gib` and the dtypes: what the capacity model (`sglang.capacity`) sizes the KV and mamba
  pools from;
- `flagged`: the assumptions and fitted values the figures rest on, printed with every projection.

`sim_options()` turns a profile into simulator settings (`SimConfig` fields), `output_rate()` into output tok/s.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from dagster_project.sglang import capacity
from dagster_project.sglang.profiles import constants
from dagster_project.sglang.profiles.roofline import Roofline, Workload, qwen3_6_27b_shapes, roofline_for
from dagster_project.sglang.sim import speculation
from dagster_project.sglang.speculative import SpecSetting

FORMAT = 1
# Running requests the roofline curves are tabulated at (a measured curve has its own).
RUNNING_POINTS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)


@dataclass(frozen=True)
class SpecSettings:
    """NEXTN/MTP speculative decoding: `--speculative-num-steps`, `-eagle-topk`, `-num-draft-tokens`."""

    steps: int = 3
    topk: int = 1
    draft_tokens: int = 4

    @property
    def enabled(self) -> bool:
        return self.steps > 0

    @property
    def label(self) -> str:
        return f"NEXTN {self.steps}/{self.topk}/{self.draft_tokens}" if self.enabled else "MTP off"


SPEC_OFF = SpecSettings(0, 1, 0)
SEED_SPEC = SpecSettings(3, 1, 4)  # the seed run's launch flags (and `dflash fleet up`'s)


@dataclass(frozen=True)
class DecodeCurve:
    spec: SpecSettings
    accept_length: float  # tokens per verify pass under load; 1.0 with speculative decoding off
    points: tuple[tuple[int, float], ...]  # (running requests, seconds per decode step), running ascending

    def step_s(self, running: float) -> float:
        """Decode step time at `running`: linear between the points, extended along the last two past the ends."""
        pts = self.points
        if len(pts) == 1:
            return pts[0][1]
        i = next((k for k in range(1, len(pts) - 1) if running <= pts[k][0]), len(pts) - 1)
        (b0, s0), (b1, s1) = pts[i - 1], pts[i]
        return s0 + (s1 - s0) * (running - b0) / (b1 - b0)

    def decode_rate(self, running: int) -> float:
        """Output tok/s of the decode batches alone (what SGLang logs as gen throughput)."""
        return running * self.accept_length / self.step_s(running)


@dataclass(frozen=True)
class GpuProfile:
    name: str  # e.g. "b200-bf16"
    gpu: str
    weights: str  # bf16 | fp8
    kv_cache_dtype: str
    mamba_ssm_dtype: str
    memory_gib: float  # nvidia-smi's total
    weights_gib: float  # the loaded weights (language model, MTP layer, vision encoder)
    prefill_s_per_token: float
    ttft_s: float
    context_tokens: float  # the mean decode context the curves were computed or measured at
    curves: tuple[DecodeCurve, ...]
    source: str  # "roofline" or where and when it was measured
    flagged: tuple[str, ...] = ()  # assumptions and fitted values (constants names, or free text)
    format: int = FORMAT

    def curve(self, spec: SpecSettings = SEED_SPEC) -> DecodeCurve:
        for curve in self.curves:
            if curve.spec == spec:
                return curve
        known = ", ".join(curve.spec.label for curve in self.curves)
        raise KeyError(f"profile {self.name} has no curve for {spec.label} (it has: {known})")

    def output_rate(
        self, running: int, output_tokens: float, prompt_tokens: float, spec: SpecSettings = SEED_SPEC
    ) -> float:
        """Steady output tok/s of one GPU keeping `running` requests decoding, each prefilled on arrival: per output
        token, its share of a decode step plus its request's prefill over its length."""
        curve = self.curve(spec)
        decode = curve.step_s(running) / (running * curve.accept_length)
        prefill = (self.ttft_s + prompt_tokens * self.prefill_s_per_token) / output_tokens
        return 1.0 / (decode + prefill)

    def launch_settings(self, spec: SpecSettings = SEED_SPEC, **flags: Any) -> capacity.LaunchSettings:
        return capacity.LaunchSettings(
            speculative_draft_tokens=spec.draft_tokens if spec.enabled else 0,
            kv_cache_dtype=self.kv_cache_dtype,
            mamba_ssm_dtype=self.mamba_ssm_dtype,
            **flags,
        )

    @property
    def gpu_memory(self) -> capacity.GpuMemory:
        return capacity.GpuMemory(total_gib=self.memory_gib, free_gib=self.memory_gib)

    def capacity_plan(self, tokens_per_request: float, spec: SpecSettings = SEED_SPEC) -> capacity.LaunchPlan:
        """The launch flags that run the most requests of this length at once in this GPU's memory."""
        model = _model_with_weights(self.weights_gib)
        return capacity.plan_for_gpu(self.gpu_memory, tokens_per_request, self.launch_settings(spec), model=model)

    def sim_options(self, spec: SpecSettings = SEED_SPEC, running_range: tuple[int, int] = (1, 64)) -> dict[str, Any]:
        """`SimConfig` settings that reproduce this profile: the step curve fitted as `decode_step_s x (1 + growth x
        (running - 1))` over `running_range`, acceptance per draft as a chain with this accept length, the memory
        model of this GPU and these weights."""
        curve = self.curve(spec)
        served = SpecSetting(spec.steps, spec.topk, spec.draft_tokens) if spec.enabled else None
        # The simulator's step is the 3/1/4 one, other settings priced from it: this curve's step, expressed so.
        step_1, growth = speculation.recipe_step(served, *fit_linear_step(curve, running_range))
        settings = self.launch_settings(spec)
        _, fraction = capacity.gpu_budget_bytes(self.gpu_memory, settings, model=_model_with_weights(self.weights_gib))
        options: dict[str, Any] = {
            "speculative": spec.enabled,
            "decode_step_s": step_1,
            "decode_step_growth": growth,
            "prefill_s_per_token": self.prefill_s_per_token,
            "ttft_s": self.ttft_s,
            "gpu_memory_gb": self.gpu_memory.free_before_load_gib,
            "weights_gb": self.weights_gib,
            "mem_fraction_static": fraction,
            "kv_cache_dtype": self.kv_cache_dtype,
            "mamba_ssm_dtype": self.mamba_ssm_dtype,
        }
        if spec.enabled:
            options["spec_draft_tokens"] = spec.draft_tokens
            options["speculative_num_steps"] = spec.steps
            options["speculative_eagle_topk"] = spec.topk
            options["accept_probs"] = chain_accept_probs(curve.accept_length, spec.draft_tokens)
        return options

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, raw: bytes) -> GpuProfile:
        data = orjson.loads(raw)
        if data.get("format") != FORMAT:
            raise ValueError(f"profile format {data.get('format')!r}, this version reads {FORMAT}")
        curves = tuple(
            DecodeCurve(
                spec=SpecSettings(**curve["spec"]),
                accept_length=float(curve["accept_length"]),
                points=tuple((int(b), float(s)) for b, s in curve["points"]),
            )
            for curve in data.pop("curves")
        )
        for curve in curves:
            if not curve.points or any(b1 <= b0 for (b0, _), (b1, _) in zip(curve.points, curve.points[1:])):
                raise ValueError(f"{curve.spec.label}: points must be (running, seconds) with running ascending")
        return cls(**{**data, "curves": curves, "flagged": tuple(data.get("flagged", ()))})

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        staging.write_bytes(self.to_json())
        os.replace(staging, path)
        return path

    @classmethod
    def load(cls, path: Path) -> GpuProfile:
        return cls.from_json(Path(path).read_bytes())


def _model_with_weights(weights_gib: float) -> capacity.HybridModel:
    return replace(capacity.QWEN3_6_27B, weights_gib=weights_gib)


def fit_linear_step(curve: DecodeCurve, running_range: tuple[int, int]) -> tuple[float, float]:
    """(step at one running request, growth per extra one) of the least-squares line through the curve, sampled at
    every running count in the range, relative errors weighed equally."""
    lo, hi = running_range
    xs = list(range(lo, hi + 1))
    ys = [curve.step_s(b) for b in xs]
    # Minimize sum(((a + c x) / y - 1)^2): linear in (a, c) with rows (1/y, x/y).
    s11 = sum(1 / y**2 for y in ys)
    s12 = sum(x / y**2 for x, y in zip(xs, ys))
    s22 = sum(x * x / y**2 for x, y in zip(xs, ys))
    t1 = sum(1 / y for y in ys)
    t2 = sum(x / y for x, y in zip(xs, ys))
    det = s11 * s22 - s12 * s12
    a, c = (t1 * s22 - t2 * s12) / det, (s11 * t2 - s12 * t1) / det
    step_1 = a + c
    return step_1, c / step_1


def chain_accept_probs(accept_length: float, draft_tokens: int) -> tuple[float, ...]:
    """P(k drafts accepted), k < draft_tokens, for a chain whose every draft is accepted with the same probability
    a (given its predecessors were), a solved so the mean tokens per pass is `accept_length`."""
    drafts = draft_tokens - 1
    if not 1.0 <= accept_length <= draft_tokens:
        raise ValueError(f"accept length {accept_length} outside [1, {draft_tokens}]")
    a = per_draft_acceptance(accept_length, drafts)
    probs = [a**k * (1 - a) for k in range(drafts)] + [a**drafts]
    return tuple(probs)


def per_draft_acceptance(accept_length: float, drafts: int) -> float:
    """The a with 1 + a + a^2 + ... + a^drafts = accept_length."""
    return speculation.per_draft_acceptance(accept_length - 1, drafts)


def accept_length_for(spec: SpecSettings) -> float:
    """Accept length under load at these settings: the seed's 3.08 at NEXTN 3/1/4, other chain lengths from the
    same per-draft acceptance (an assumption: no published SGLang measurement for this model; topk 1 only)."""
    if not spec.enabled:
        return 1.0
    if spec.topk != 1:
        raise ValueError("the accept-length model covers chains (topk 1) only")
    a = per_draft_acceptance(constants.value("seed.accept_length"), SEED_SPEC.steps)
    return 1 + sum(a**i for i in range(1, min(spec.steps, spec.draft_tokens - 1) + 1))


ROOFLINE_SPECS = (SEED_SPEC, SpecSettings(1, 1, 2), SpecSettings(2, 1, 3), SpecSettings(4, 1, 5), SPEC_OFF)
FLAGGED_ALWAYS = (
    "accept length independent of the running requests (no published SGLang measurement at batch)",
    "accept length at other chain lengths from the seed's per-draft acceptance",
)


@dataclass(frozen=True)
class ProfileSpec:
    """What `build_profile` builds: a GPU, its weights, and the workload the curves are computed at."""

    gpu: str
    weights: str = "bf16"
    kv_cache_dtype: str = "fp8_e4m3"
    mamba_ssm_dtype: str = "float32"
    context_tokens: float = field(
        default_factory=lambda: constants.value("seed.prompt_tokens") + constants.value("seed.output_tokens") / 2
    )


def build_profile(spec: ProfileSpec, roofline: Roofline | None = None) -> GpuProfile:
    """The roofline profile of Qwen3.6-27B on `spec.gpu` with these weights (see `roofline`)."""
    model = roofline or roofline_for(spec.gpu)
    curves = []
    for settings in ROOFLINE_SPECS:
        work = Workload(spec.weights, spec.kv_cache_dtype, spec.mamba_ssm_dtype, settings.steps, spec.context_tokens)
        points = tuple((b, model.decode_step_s(b, work)) for b in RUNNING_POINTS)
        curves.append(DecodeCurve(settings, accept_length_for(settings), points))
    prefill = model.prefill_s_per_token(Workload(spec.weights, spec.kv_cache_dtype, spec.mamba_ssm_dtype))
    vision = capacity.QWEN3_6_27B.weights_gib - qwen3_6_27b_shapes().weights_bytes("bf16") / capacity.GIB
    weights_gib = qwen3_6_27b_shapes().weights_bytes(spec.weights) / capacity.GIB + max(vision, 0.0)
    flagged = tuple(row.name for row in constants.TABLE if row.flagged) + FLAGGED_ALWAYS
    return GpuProfile(
        name=f"{spec.gpu}-{spec.weights}",
        gpu=spec.gpu,
        weights=spec.weights,
        kv_cache_dtype=spec.kv_cache_dtype,
        mamba_ssm_dtype=spec.mamba_ssm_dtype,
        memory_gib=model.hardware.memory_gib,
        weights_gib=round(weights_gib, 2),
        prefill_s_per_token=prefill,
        ttft_s=0.0,
        context_tokens=spec.context_tokens,
        curves=tuple(curves),
        source="roofline of published figures (docs/GPU_PROFILES.md)",
        flagged=flagged,
    )


PROFILES = tuple(ProfileSpec(gpu, weights) for gpu in ("h200", "b200") for weights in ("bf16", "fp8"))


def profile_named(name: str, context_tokens: float | None = None) -> GpuProfile:
    """A built-in roofline profile by name (`b200-bf16`, `h200-fp8`, ...), its curves at `context_tokens` of mean
    decode context (default: the seed's)."""
    for spec in PROFILES:
        if f"{spec.gpu}-{spec.weights}" == name:
            return build_profile(spec if context_tokens is None else replace(spec, context_tokens=context_tokens))
    names = ", ".join(f"{s.gpu}-{s.weights}" for s in PROFILES)
    raise ValueError(f"unknown profile {name!r}: one of {names}")
