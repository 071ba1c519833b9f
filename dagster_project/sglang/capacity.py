"""How many requests one SGLang 0.5.23 server runs at once for a hybrid model, what limits it, what would raise it.

A hybrid model (Qwen3.6-27B: 48 linear-attention layers with a fixed-size recurrent state, 16 full-attention
layers with a per-token KV cache) splits the memory left after the weights between two pools: mamba state
slots (a fixed number per running request) and KV tokens (as many per request as its prompt and output).
0.5.23 splits them by `--mamba-full-memory-ratio` (default 0.9), or sizes the state pool to exactly
`--max-running-requests` when the radix cache is off, then caps running requests at
`min(configured, token_capacity // 2, state slots // slots per request)`. With the radix cache on, every
running request holds several slots, and the default ratio leaves most of the memory to KV tokens that
requests of a few thousand tokens never use.

This module mirrors that sizing (`size_pools`), reads a server's `/server_info` (`analyze`) to say what binds
its cap and what the same memory would give under other flags, and plans launches (`plan_launch`). Source
references are to the sglang 0.5.23 wheel (`sglang/srt/...`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

GIB = 1 << 30

# --max-running-requests when speculative decoding is on and the flag unset (arg_groups/speculative_hook.py:1086-1094).
SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48
# State slots a running request holds with the radix cache on, before the tracking slots of the
# extra_buffer strategies (mem_cache/kv_cache_configurator.py:222-229).
RADIX_BASE_STATE_SLOTS = 3
# Multimodal memory reserved out of the pool budget: SGLANG_VLM_CACHE_SIZE_MB = 100 (environ.py:1598,
# mem_cache/kv_cache_configurator.py:202-219); Qwen3.6 is a vision-language model.
MULTIMODAL_RESERVE_GIB = 100 / 1024
# The request a launch is sized for when nothing was observed yet: a prompt and a thinking answer, ~2.6K tokens.
EXPECTED_PROMPT_TOKENS = 600.0
EXPECTED_OUTPUT_TOKENS = 2000.0
# Decode CUDA-graph batch sizes captured by default on a 90-160 GiB GPU at tp 1 (arg_groups/memory_hook.py:146-159).
DEFAULT_CUDA_GRAPH_MAX_BS = 256

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
RADIX_STRATEGIES = ("extra_buffer", "extra_buffer_lazy", "no_buffer")


def dtype_bytes(dtype: str) -> int:
    try:
        return _DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: one of {', '.join(_DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class HybridModel:
    """The architecture facts that size a hybrid model's two pools."""

    name: str
    linear_layers: int  # Gated DeltaNet layers, each with a conv state and an SSM state per slot
    linear_key_heads: int
    linear_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    full_attention_layers: int  # layers with a per-token KV cache
    kv_heads: int
    head_dim: int
    draft_layers: int  # MTP layers: their KV shares the target's token slots
    weights_gib: float = 0.0  # GPU memory the loaded weights take (the boot log's "mem usage" after loading)
    vit_layers: int = 0  # the vision encoder, which lowers the automatic --mem-fraction-static of a VLM
    vit_hidden_size: int = 0

    def state_bytes_per_slot(self, ssm_dtype: str = "float32") -> int:
        """`mamba_cache_per_req`: conv + SSM state over every linear layer (configs/mamba_utils.py:116-125,
        shapes from configs/qwen3_next.py:287-313 and mamba_utils.py:195-243; the conv state stays bf16)."""
        value_dim = self.linear_value_heads * self.linear_value_head_dim
        conv_dim = value_dim + 2 * self.linear_key_heads * self.linear_key_head_dim  # conv over [q, k, v]
        conv = conv_dim * (self.conv_kernel - 1) * dtype_bytes("bfloat16")
        ssm = value_dim * self.linear_key_head_dim * dtype_bytes(ssm_dtype)
        return (conv + ssm) * self.linear_layers

    def kv_bytes_per_token(self, kv_dtype: str = "auto", speculative: bool = True) -> int:
        """KV cell size: K and V of every full-attention layer, plus the draft layers' share under EAGLE/MTP
        (model_executor/pool_configurator.py:219-314)."""
        cell = self.full_attention_layers * 2 * self.kv_heads * self.head_dim * dtype_bytes(kv_dtype)
        if speculative and self.draft_layers:
            cell += int(cell * self.draft_layers / self.full_attention_layers)
        return cell


# Qwen3.6-27B (model card; Qwen3_5ForConditionalGeneration): 64 layers = 48 GDN + 16 full attention, one MTP layer.
QWEN3_6_27B = HybridModel(
    name="Qwen3.6-27B",
    linear_layers=48,
    linear_key_heads=16,
    linear_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    conv_kernel=4,
    full_attention_layers=16,
    kv_heads=4,
    head_dim=256,
    draft_layers=1,
    weights_gib=52.31,  # a typical boot log: bf16 language model, MTP layer and ViT
    vit_layers=27,
    vit_hidden_size=1152,
)


@dataclass(frozen=True)
class LaunchSettings:
    """The launch flags that size the pools, with 0.5.23's defaults (None: the flag is not given)."""

    max_running_requests: int | None = None
    mamba_full_memory_ratio: float = 0.9
    max_mamba_cache_size: int | None = None
    disable_radix_cache: bool = False
    mamba_radix_cache_strategy: str = "extra_buffer"  # what "auto" resolves to for this model with overlap on
    overlap_schedule: bool = True
    speculative_draft_tokens: int = 4  # D of NEXTN 3/1/4; 0: no speculative decoding
    mamba_ssm_dtype: str = "float32"  # the model config's value when the flag is unset
    kv_cache_dtype: str = "auto"
    context_length: int = 65536
    page_size: int = 1
    cuda_graph_max_bs: int | None = None  # --cuda-graph-max-bs-decode

    @property
    def speculative(self) -> bool:
        return self.speculative_draft_tokens > 0

    @property
    def configured_max_running_requests(self) -> int | None:
        """The flag as the server resolves it: speculative decoding fills in 48."""
        if self.max_running_requests is None and self.speculative:
            return SPEC_DEFAULT_MAX_RUNNING_REQUESTS
        return self.max_running_requests

    @property
    def state_slots_per_request(self) -> int:
        """Mamba state slots one running request holds (`_calculate_mamba_ratio`,
        mem_cache/kv_cache_configurator.py:3062-3088, with mem_cache/allocation_sizing.py:11-19)."""
        if self.disable_radix_cache:
            return 1
        strategy = self.mamba_radix_cache_strategy
        if strategy == "no_buffer":
            return RADIX_BASE_STATE_SLOTS
        if strategy == "extra_buffer_lazy":
            return RADIX_BASE_STATE_SLOTS + 1
        if strategy == "extra_buffer":
            return RADIX_BASE_STATE_SLOTS + (2 if self.overlap_schedule else 1)
        raise ValueError(f"unknown mamba radix cache strategy {strategy!r}: one of {', '.join(RADIX_STRATEGIES)}")


class Resource(enum.Enum):
    """What can limit how many requests a server runs at once."""

    CONFIGURED = "the configured maximum"
    MAMBA_SLOTS = "mamba state slots"
    KV_POOL = "the KV pool size (at most one request per 2 tokens)"
    KV_AT_LENGTHS = "KV tokens at the observed lengths"
    CUDA_GRAPH = "the CUDA-graph batch size (larger batches decode without graphs)"


@dataclass(frozen=True)
class Pools:
    """How 0.5.23 splits a memory budget: the state pool, the KV pool and the running-request cap."""

    max_mamba_cache_size: int
    max_total_num_tokens: int
    max_running_requests: int  # the cap in force (`effective_max_running_requests_per_dp`)
    bound: Resource  # which of configured / mamba slots / KV pool set the cap
    state_bytes: int  # state slots (+1 padding) and the draft snapshots of the running requests
    kv_bytes: int

    def concurrency(self, tokens_per_request: float) -> int:
        """Requests that run at once when each holds `tokens_per_request` KV tokens."""
        return min(self.max_running_requests, kv_concurrency(self.max_total_num_tokens, tokens_per_request))


def kv_concurrency(max_total_num_tokens: int, tokens_per_request: float) -> int:
    return int(max_total_num_tokens // max(tokens_per_request, 1.0))


def pool_budget_bytes(
    free_gib_before_load: float,
    weights_gib: float,
    mem_fraction_static: float,
    multimodal_reserve_gib: float = MULTIMODAL_RESERVE_GIB,
) -> int:
    """Bytes 0.5.23 splits between the state and KV pools (`_profile_available_bytes`,
    mem_cache/kv_cache_configurator.py:2990-3060): the memory free after the weights load, less the
    runtime slack `free_before_load × (1 − mem_fraction_static)` and the multimodal reserve."""
    slack = free_gib_before_load * (1 - mem_fraction_static)
    rest = free_gib_before_load - weights_gib - slack - multimodal_reserve_gib
    if rest <= 0:
        raise ValueError(
            f"the weights leave no memory for the pools under mem_fraction_static={mem_fraction_static} "
            f"({free_gib_before_load:.2f} GiB free, {weights_gib:.2f} GiB of weights)"
        )
    return int(rest * GIB)


def size_pools(budget_bytes: int, settings: LaunchSettings, model: HybridModel = QWEN3_6_27B) -> Pools:
    """The pools and cap 0.5.23 derives from `budget_bytes` (see `pool_budget_bytes`) under `settings`.

    Mirrors `_handle_max_mamba_cache` (mem_cache/kv_cache_configurator.py:3229-3409), the KV pool of
    `DefaultPoolConfigurator.calculate_pool_sizes` (model_executor/pool_configurator.py:637-647) and
    `resolve_max_num_reqs` (mem_cache/kv_cache_configurator.py:3119-3172), for one GPU (no DP, PP or
    ReplaySSM).
    """
    slot = model.state_bytes_per_slot(settings.mamba_ssm_dtype)
    draft = settings.speculative_draft_tokens
    per_request = settings.state_slots_per_request
    configured = settings.configured_max_running_requests
    if settings.max_mamba_cache_size is not None:
        slots = settings.max_mamba_cache_size
    elif settings.disable_radix_cache and configured is not None:
        slots = max(1, configured)  # the pool is exactly the cap
    else:
        ratio = settings.mamba_full_memory_ratio
        mamba_budget = budget_bytes * ratio / (1 + ratio)
        # Solved jointly under speculative decoding: the slots, plus the snapshots of the requests they
        # can serve, fill the state's share of the budget.
        slots = int((mamba_budget - slot * (1 + draft)) // (slot * (1 + draft / per_request)))
    if slots <= 0:
        raise ValueError(f"the budget leaves no mamba state slots ({budget_bytes / GIB:.2f} GiB to split)")
    state_bytes = state_pool_bytes(settings, slots, model)
    kv_bytes = budget_bytes - state_bytes
    cell = model.kv_bytes_per_token(settings.kv_cache_dtype, settings.speculative)
    tokens = max(kv_bytes, 0) // cell // settings.page_size * settings.page_size
    if tokens <= 0:
        raise ValueError(f"the mamba state pool ({state_bytes / GIB:.2f} GiB) leaves no KV tokens")

    cap, bound = requested_max_running_requests(settings, tokens), Resource.CONFIGURED
    if tokens // 2 < cap:
        cap, bound = tokens // 2, Resource.KV_POOL
    if slots // per_request < cap:
        cap, bound = slots // per_request, Resource.MAMBA_SLOTS
    if cap <= 0:
        raise ValueError(f"{slots} mamba state slots serve no request at {per_request} slots per request")
    return Pools(slots, tokens, cap, bound, state_bytes, tokens * cell)


def state_pool_bytes(settings: LaunchSettings, slots: int, model: HybridModel = QWEN3_6_27B) -> int:
    """Bytes of a state pool of `slots` slots: the slots, +1 padding, and under speculative decoding the
    draft tokens' SSM snapshots of every request the slots can serve, +1 padding
    (mem_cache/kv_cache_configurator.py:3313-3324, 3338-3344, 3370-3377, 3404-3408)."""
    # Drafts imply a configured cap (48 when unset), so `or 1` only stands in where snapshots are 0.
    served = min(max(1, settings.configured_max_running_requests or 1), slots // settings.state_slots_per_request)
    snapshots = (served + 1) * settings.speculative_draft_tokens
    return (slots + 1 + snapshots) * model.state_bytes_per_slot(settings.mamba_ssm_dtype)


def requested_max_running_requests(settings: LaunchSettings, max_total_num_tokens: int) -> int:
    """The cap asked for: the configured one, or with none an estimate from the KV pool between 2048 and
    4096 (mem_cache/kv_cache_configurator.py:3122-3132)."""
    configured = settings.configured_max_running_requests
    if configured is not None:
        return max(1, configured)
    return max(min(int(max_total_num_tokens / settings.context_length * 512), 4096), 2048)


def decode_cuda_graph_bs(settings: LaunchSettings, cap: int) -> list[int]:
    """Decode batch sizes captured as CUDA graphs (arg_groups/cuda_graph_hook.py:500-532, clamped to the
    flag at arg_groups/memory_hook.py:182-188 and to the request pool at
    model_executor/runner/base_cuda_graph_runner.py:65-110)."""
    max_bs = settings.cuda_graph_max_bs
    if max_bs is None:
        configured = settings.configured_max_running_requests
        max_bs = min(DEFAULT_CUDA_GRAPH_MAX_BS, configured or DEFAULT_CUDA_GRAPH_MAX_BS)
    if settings.speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    captured = {size for size in sizes if size <= max_bs} | {max_bs}
    return sorted({min(size, cap) for size in captured})


# ---- planning --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchPlan:
    """Launch settings for a memory budget and request length, and what they give."""

    settings: LaunchSettings
    flags: tuple[str, ...]  # the capacity flags to pass
    pools: Pools
    tokens_per_request: float
    note: str = ""  # what else the flags change, if anything
    mem_fraction_static: float | None = None  # the fraction planned with (`plan_for_gpu`), automatic or given

    @property
    def concurrency(self) -> int:
        return self.pools.concurrency(self.tokens_per_request)

    @property
    def cap(self) -> int:
        """The running-request cap the server will compute under these flags."""
        return self.pools.max_running_requests

    def describe(self) -> str:
        pools = self.pools
        text = (
            f"`{' '.join(self.flags)}`: {self.concurrency} running, "
            f"state pool {pools.state_bytes / GIB:.1f} GiB, KV pool {pools.kv_bytes / GIB:.1f} GiB "
            f"({_tokens(pools.max_total_num_tokens)} tokens)"
        )
        return f"{text}; {self.note}" if self.note else text


def plan_launch(
    budget_bytes: int,
    tokens_per_request: float,
    base: LaunchSettings = LaunchSettings(),
    *,
    radix_cache: bool = False,
    model: HybridModel = QWEN3_6_27B,
) -> LaunchPlan:
    """The `--max-running-requests` (radix cache off) or `--mamba-full-memory-ratio` (radix cache on) that
    balances the two pools for requests of `tokens_per_request` tokens (prompt + output), so that neither
    pool is left idle. `base` carries the other settings (speculative decoding, dtypes, strategy).

    Both are solved in closed form, then checked against `size_pools` and lowered until they hold.
    """
    settings = replace(base, disable_radix_cache=not radix_cache, max_mamba_cache_size=None)
    slot = model.state_bytes_per_slot(settings.mamba_ssm_dtype)
    cell = model.kv_bytes_per_token(settings.kv_cache_dtype, settings.speculative)
    draft = settings.speculative_draft_tokens
    per_request = settings.state_slots_per_request
    # A running request costs its slots with their snapshots, and its KV tokens; +1 for the pools' padding.
    request_bytes = (per_request + draft) * slot + tokens_per_request * cell
    target = max(1, int((budget_bytes - (1 + draft) * slot) // request_bytes))
    for running in range(target, 0, -1):
        if radix_cache:
            # The state budget that holds `running` requests' slots and snapshots, as a share of the whole.
            state = (1 + draft) * slot + per_request * running * slot * (1 + draft / per_request)
            ratio = math.ceil(state / (budget_bytes - state) * 1000) / 1000
            candidate = replace(settings, mamba_full_memory_ratio=ratio, max_running_requests=running)
            flags: tuple[str, ...] = ("--mamba-full-memory-ratio", str(ratio), "--max-running-requests", str(running))
        else:
            candidate = replace(settings, max_running_requests=running)
            flags = ("--disable-radix-cache", "--max-running-requests", str(running))
        try:
            pools = size_pools(budget_bytes, candidate, model)
        except ValueError:
            continue
        if pools.concurrency(tokens_per_request) >= running:
            return LaunchPlan(candidate, flags + _dtype_flags(candidate), pools, tokens_per_request)
    raise ValueError(f"{budget_bytes / GIB:.2f} GiB holds no request of {tokens_per_request:.0f} tokens")


# ---- planning for a GPU ------------------------------------------------------------------------------

# GPU memory a process's CUDA context takes before the weights load: `nvidia-smi`'s free memory less this is
# what the server reports as "avail mem" before loading (an H200 shows 140.4 GiB total, ~139.4 GiB then).
CUDA_CONTEXT_GIB = 1.0
# Prefill CUDA-graph token buckets up to --chunked-prefill-size 8192 (arg_groups/cuda_graph_hook.py:480-497).
PREFILL_GRAPH_BUCKETS = 58
CHUNKED_PREFILL_SIZE = 8192  # on a 90-160 GiB GPU (arg_groups/memory_hook.py:146-160)


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as `nvidia-smi` sees it before the server starts."""

    total_gib: float
    free_gib: float

    @property
    def free_before_load_gib(self) -> float:
        return self.free_gib - CUDA_CONTEXT_GIB


def auto_mem_fraction_static(total_gib: float, decode_max_bs: int, model: HybridModel = QWEN3_6_27B) -> float:
    """The `--mem-fraction-static` 0.5.23 picks when the flag is unset (arg_groups/memory_hook.py:281-342):
    `round((gpu − reserved) / gpu, 3)` with `reserved = 512 + 1.5 × chunked prefill + 128 + graphs` MiB (at least
    10 GiB above 60 GiB), graphs = 2 MiB per decode batch size up to the largest + 8 MiB per prefill bucket
    (memory_hook.py:357-399); a VLM's is then scaled by `0.95 × (1 − 0.1 × (ViT size / ViT-L − 1))`, clamped
    to [0.8, 1.05] (memory_hook.py:417-462)."""
    gpu_mib = total_gib * 1024
    reserved = 512 + CHUNKED_PREFILL_SIZE * 1.5 + 1024 / 8 + decode_max_bs * 2 + PREFILL_GRAPH_BUCKETS * 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    fraction = round((gpu_mib - reserved) / gpu_mib, 3)
    if model.vit_layers:
        complexity = model.vit_layers * model.vit_hidden_size**2 / (24 * 1024**2)
        fraction *= 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (complexity - 1.0)))
    return fraction


def gpu_budget_bytes(
    gpu: GpuMemory,
    settings: LaunchSettings,
    *,
    mem_fraction_static: float | None = None,
    model: HybridModel = QWEN3_6_27B,
) -> tuple[int, float]:
    """The pool budget a server launched with `settings` finds on `gpu`, and the memory fraction it uses:
    the given one, or 0.5.23's automatic one for the decode CUDA-graph batch size `settings` imply."""
    if mem_fraction_static is None:
        configured = settings.configured_max_running_requests
        max_bs = settings.cuda_graph_max_bs or min(DEFAULT_CUDA_GRAPH_MAX_BS, configured or DEFAULT_CUDA_GRAPH_MAX_BS)
        mem_fraction_static = auto_mem_fraction_static(gpu.total_gib, max_bs, model)
    budget = pool_budget_bytes(gpu.free_before_load_gib, model.weights_gib, mem_fraction_static)
    return budget, mem_fraction_static


def plan_for_gpu(
    gpu: GpuMemory,
    tokens_per_request: float,
    base: LaunchSettings = LaunchSettings(),
    *,
    mem_fraction_static: float | None = None,
    radix_cache: bool = False,
    margin: float = 0.0,
    model: HybridModel = QWEN3_6_27B,
) -> LaunchPlan:
    """`plan_launch` on the budget a server finds on `gpu`. With the fraction left automatic it depends on the
    cap planned (the decode CUDA graphs' reserve), so plan and fraction are solved together. `margin` plans
    with that share of the budget left unused, for GPUs whose free memory is only estimated."""
    settings = base
    plan: LaunchPlan | None = None
    for _ in range(8):  # a larger cap lowers the automatic fraction, which lowers the cap: a few rounds settle
        budget, fraction = gpu_budget_bytes(gpu, settings, mem_fraction_static=mem_fraction_static, model=model)
        planned = plan_launch(
            int(budget * (1 - margin)), tokens_per_request, base, radix_cache=radix_cache, model=model
        )
        planned = replace(planned, mem_fraction_static=fraction)
        if plan is not None and planned.settings == plan.settings:
            return planned
        plan, settings = planned, planned.settings
    assert plan is not None
    return plan


def _dtype_flags(settings: LaunchSettings) -> tuple[str, ...]:
    """The dtype flags a plan needs beyond the model's defaults (fp32 SSM state, bf16 KV)."""
    flags: tuple[str, ...] = ()
    if settings.mamba_ssm_dtype != "float32":
        flags += ("--mamba-ssm-dtype", settings.mamba_ssm_dtype)
    if settings.kv_cache_dtype != "auto":
        flags += ("--kv-cache-dtype", settings.kv_cache_dtype)
    return flags


# ---- a running server ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerState:
    """The capacity facts of `/server_info` (0.5.23 field names; `internal_states[0]` holds the values the
    scheduler computed at startup, `managers/scheduler_components/internal_state.py:45-130`)."""

    settings: LaunchSettings
    cap: int  # effective_max_running_requests_per_dp
    max_mamba_cache_size: int | None  # None: a model without mamba layers (a dense one), no state pool
    max_total_num_tokens: int
    max_req_input_len: int
    decode_cuda_graph_bs: tuple[int, ...]
    kv_cache_gib: float | None  # memory_usage.kvcache
    weight_gib: float | None  # memory_usage.weight

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any]) -> ServerState:
        state = {**info, **((info.get("internal_states") or [{}])[0])}
        memory = state.get("memory_usage") or {}
        speculative = state.get("speculative_algorithm") is not None
        disable_radix = bool(state.get("disable_radix_cache"))
        strategy = state.get("mamba_radix_cache_strategy") or "auto"
        overlap = not state.get("disable_overlap_schedule")
        if strategy == "auto":  # resolved at startup (arg_groups/overrides.py:453-487)
            strategy = "extra_buffer" if overlap else "no_buffer"
        settings = LaunchSettings(
            max_running_requests=state.get("max_running_requests"),
            mamba_full_memory_ratio=state.get("mamba_full_memory_ratio") or 0.9,
            disable_radix_cache=disable_radix,
            mamba_radix_cache_strategy=strategy,
            overlap_schedule=overlap,
            speculative_draft_tokens=(state.get("speculative_num_draft_tokens") or 0) if speculative else 0,
            mamba_ssm_dtype=state.get("mamba_ssm_dtype") or "float32",
            kv_cache_dtype=state.get("kv_cache_dtype") or "auto",
            context_length=state["context_length"],
            page_size=state.get("page_size") or 1,
            cuda_graph_max_bs=max(state.get("decode_cuda_graph_bs") or [0]) or None,
        )
        return cls(
            settings=settings,
            cap=state["effective_max_running_requests_per_dp"],
            max_mamba_cache_size=state.get("max_mamba_cache_size"),
            max_total_num_tokens=state["max_total_num_tokens"],
            max_req_input_len=state["max_req_input_len"],
            decode_cuda_graph_bs=tuple(state.get("decode_cuda_graph_bs") or ()),
            kv_cache_gib=memory.get("kvcache"),
            weight_gib=memory.get("weight"),
        )

    def budget_bytes(self, model: HybridModel = QWEN3_6_27B) -> int:
        """The memory the server split between its pools: its KV pool and its state pool, rebuilt from their sizes."""
        settings = self.settings
        cell = model.kv_bytes_per_token(settings.kv_cache_dtype, settings.speculative)
        return self.state_bytes(model) + self.max_total_num_tokens * cell

    def state_bytes(self, model: HybridModel = QWEN3_6_27B) -> int:
        if self.max_mamba_cache_size is None:
            return 0
        return state_pool_bytes(self.settings, self.max_mamba_cache_size, model)


# Headroom below this is not worth a relaunch: `explain` names no flags for it.
MEANINGFUL_HEADROOM = 1.05


@dataclass(frozen=True)
class CapacityReport:
    """What binds a server's concurrency at the observed request lengths, and what would raise it."""

    cap: int  # the cap in force
    cap_bound: Resource  # what set the cap at startup
    limits: dict[Resource, int]  # the concurrency each resource allows on its own
    tokens_per_request: float
    slots_per_request: int
    radix_cache: bool
    state_bytes: int  # the server's state pool, draft snapshots included
    kv_bytes: int  # its KV pool
    options: tuple[LaunchPlan, ...]  # the same memory under other flags, most concurrency first

    @property
    def concurrency(self) -> int:
        """Requests that can run at once: the cap, unless KV tokens or CUDA graphs give out first."""
        return min(self.cap, *self.limits.values())

    @property
    def bound(self) -> Resource:
        """The resource that binds: the cap's own bound when nothing is tighter."""
        tighter = [resource for resource, limit in self.limits.items() if limit < self.cap]
        return min(tighter, key=self.limits.__getitem__) if tighter else self.cap_bound

    @property
    def best(self) -> LaunchPlan | None:
        """The option with the most concurrency that leaves the numerics as they are."""
        exact = [option for option in self.options if not option.note]
        return exact[0] if exact else None

    @property
    def headroom(self) -> float:
        best = self.best
        return best.concurrency / self.concurrency if best is not None else 1.0

    def binding(self) -> str:
        """What binds the server's cap, e.g. "cap 21 per server, bound by mamba state slots (5 per request, radix
        cache on)": the one statement of it, which every answer that says what limits a server uses."""
        cache = "radix cache on" if self.radix_cache else "radix cache off"
        bound = self.bound
        detail = f" ({self.slots_per_request} per request, {cache})" if bound is Resource.MAMBA_SLOTS else ""
        text = f"cap {self.cap} per server, bound by {bound.value}{detail}"
        if self.concurrency != self.cap:
            text += f", {self.concurrency} run at once"
        return text

    def explain(self, lengths: str = "observed") -> str:
        """One line: `binding()`, then what the KV pool allows and what would raise the cap; `lengths` says where
        the request length comes from ("observed", "expected")."""
        text = self.binding()
        if self.bound is not Resource.KV_AT_LENGTHS:
            text += (
                f"; KV pool allows {self.limits[Resource.KV_AT_LENGTHS]} "
                f"at the {lengths} {_tokens(self.tokens_per_request)} tokens/request"
            )
        best = self.best
        if best is not None and self.headroom >= MEANINGFUL_HEADROOM:
            text += f"; `{' '.join(best.flags)}` → est. ×{self.headroom:.1f}"
        return text

    def describe(self) -> str:
        """`explain()`, then what each resource allows, the memory split now and under each option."""
        lines = [self.explain(), "allowed by each resource on its own:"]
        lines += [f"  {resource.value}: {limit}" for resource, limit in self.limits.items()]
        lines.append(f"memory now: state pool {self.state_bytes / GIB:.1f} GiB, KV pool {self.kv_bytes / GIB:.1f} GiB")
        lines.append("the same memory under other flags (est. × throughput, at the same step time):")
        lines += [f"  ×{option.concurrency / self.concurrency:.1f} {option.describe()}" for option in self.options]
        return "\n".join(lines)


def analyze(
    server_info: Mapping[str, Any],
    prompt_tokens: float,
    output_tokens: float,
    model: HybridModel = QWEN3_6_27B,
) -> CapacityReport:
    """What binds the concurrency of the server behind `server_info` for requests of the observed mean
    prompt and output lengths, and what its memory would give under other flags.

    A request holds its prompt and, by its end, its output: `prompt + output` KV tokens, plus the draft
    tokens' reserve under speculative decoding.
    """
    server = ServerState.from_server_info(server_info)
    settings = server.settings
    tokens = prompt_tokens + output_tokens + reserved_prompt_tokens(settings)
    per_request = settings.state_slots_per_request
    hybrid = server.max_mamba_cache_size is not None  # a dense model (a CPU test's) has no state pool to bind
    limits = {
        Resource.CONFIGURED: requested_max_running_requests(settings, server.max_total_num_tokens),
        Resource.KV_POOL: server.max_total_num_tokens // 2,
        Resource.KV_AT_LENGTHS: kv_concurrency(server.max_total_num_tokens, tokens),
    }
    if hybrid:
        limits[Resource.MAMBA_SLOTS] = server.max_mamba_cache_size // per_request
    if server.decode_cuda_graph_bs:
        limits[Resource.CUDA_GRAPH] = max(server.decode_cuda_graph_bs)
    # The order 0.5.23 applies its limits in: a later one binds only if strictly tighter.
    cap_bound = Resource.CONFIGURED
    for resource in (Resource.KV_POOL, Resource.MAMBA_SLOTS):
        if resource in limits and limits[resource] == server.cap < limits[cap_bound]:
            cap_bound = resource
    state_bytes = server.state_bytes(model)
    budget = server.budget_bytes(model)
    return CapacityReport(
        cap=server.cap,
        cap_bound=cap_bound,
        limits=limits,
        tokens_per_request=tokens,
        slots_per_request=per_request,
        radix_cache=not settings.disable_radix_cache,
        state_bytes=state_bytes,
        kv_bytes=budget - state_bytes,
        # Other flags for the same memory are a hybrid model's question (its state pool against its KV pool).
        options=alternatives(budget, tokens, settings, model) if hybrid else (),
    )


def alternatives(
    budget_bytes: int, tokens_per_request: float, settings: LaunchSettings, model: HybridModel = QWEN3_6_27B
) -> tuple[LaunchPlan, ...]:
    """The budget under the flags that raise concurrency, most concurrency first: radix cache off with a
    matching cap; radix cache on with a balanced ratio; and a bf16 SSM state on top (a numerics change)."""
    plans = [
        plan_launch(budget_bytes, tokens_per_request, settings, radix_cache=False, model=model),
        plan_launch(budget_bytes, tokens_per_request, settings, radix_cache=True, model=model),
    ]
    if settings.mamba_ssm_dtype == "float32":
        bf16 = plan_launch(budget_bytes, tokens_per_request, replace(settings, mamba_ssm_dtype="bfloat16"), model=model)
        plans.append(replace(bf16, note="a bf16 SSM state changes the numerics: check output quality first"))
    return tuple(sorted(plans, key=lambda plan: -plan.concurrency))


# The /server_info fields the capacity model reads: top level, and of `internal_states[0]`.
SERVER_INFO_FIELDS = (
    "context_length", "max_running_requests", "mamba_full_memory_ratio", "max_mamba_cache_size",
    "disable_radix_cache", "mamba_radix_cache_strategy", "disable_overlap_schedule", "speculative_algorithm",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "mamba_ssm_dtype",
    "kv_cache_dtype", "page_size", "mem_fraction_static", "max_total_num_tokens", "max_req_input_len",
)  # fmt: skip
INTERNAL_STATE_FIELDS = (
    "max_mamba_cache_size", "effective_max_running_requests_per_dp", "memory_usage", "decode_cuda_graph_bs",
)  # fmt: skip
# Speculative algorithms that reserve draft-token slots in every request's length checks.
EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN"})


def capacity_fields(server_info: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a `/server_info` body `analyze` and `reserved_tokens` need, small enough to keep per probe."""
    states = server_info.get("internal_states") or [{}]
    fields = {name: server_info.get(name) for name in SERVER_INFO_FIELDS if name in server_info}
    fields["internal_states"] = [{name: states[0].get(name) for name in INTERNAL_STATE_FIELDS if name in states[0]}]
    return fields


def reserved_tokens(server_info: Mapping[str, Any]) -> int:
    """Tokens a server adds to every prompt's length checks: `max(topk × steps, draft tokens)` under EAGLE
    (managers/utils.py:484-500, applied at managers/tokenizer_manager.py:1333-1335), else none."""
    if server_info.get("speculative_algorithm") not in EAGLE_ALGORITHMS:
        return 0
    topk = server_info.get("speculative_eagle_topk") or 1
    steps = server_info.get("speculative_num_steps") or 0
    return max(topk * steps, server_info.get("speculative_num_draft_tokens") or 0)


def reserved_prompt_tokens(settings: LaunchSettings) -> int:
    """Tokens EAGLE/NEXTN adds to every prompt's length checks for its drafts: `max(topk × steps, draft
    tokens)` (managers/utils.py:484-500), the draft tokens for a chain (topk 1, steps = draft tokens − 1)."""
    return settings.speculative_draft_tokens


def _tokens(count: float) -> str:
    return f"{count / 1000:.1f}K" if count >= 1000 else f"{count:.0f}"
