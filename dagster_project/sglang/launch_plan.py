"""The plan a GPU launch is made with, and what the servers computed: how many requests each server can run at once
for the GPU's free memory and the expected request length (`capacity`), the flags that give it, and each live
server's own figure beside the plan's."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dagster_project.sglang import capacity
from dagster_project.sglang.launch import FleetError, ServerOptions
from dagster_project.sglang.speculative import SpecSetting
from dagster_project.sglang.speculative import label as spec_label

if TYPE_CHECKING:  # the client imports aiohttp: only what talks to servers imports it, when it does
    from dagster_project.sglang.client import SGLangError

# Share of the pool budget a GPU launch plan leaves unused: free memory before start is an estimate of what
# the server will find ("avail mem" in its log).
PLAN_MARGIN = 0.02


@dataclass(frozen=True)
class CapacityTarget:
    """What a GPU launch is sized for: the request it expects and the memory it finds."""

    expected_prompt_tokens: float = field(
        default=capacity.EXPECTED_PROMPT_TOKENS,
        metadata={
            "help": f"mean prompt tokens the servers are sized for (default {capacity.EXPECTED_PROMPT_TOKENS:.0f})"
        },
    )
    expected_output_tokens: float = field(
        default=capacity.EXPECTED_OUTPUT_TOKENS,
        metadata={
            "help": f"mean output tokens the servers are sized for (default {capacity.EXPECTED_OUTPUT_TOKENS:.0f})"
        },
    )
    gpu_memory_gib: float | None = field(
        default=None, metadata={"help": "GiB free on each GPU before start; default: nvidia-smi"}
    )

    def tokens_per_request(self, settings: capacity.LaunchSettings) -> float:
        return self.expected_prompt_tokens + self.expected_output_tokens + capacity.reserved_prompt_tokens(settings)


def parse_nvidia_smi(text: str) -> dict[int, capacity.GpuMemory]:
    """`nvidia-smi --query-gpu=index,memory.total,memory.free --format=csv,noheader,nounits` (MiB) by GPU index."""
    memory = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == 3 and all(cell.isdigit() for cell in cells):
            index, total, free = map(int, cells)
            memory[index] = capacity.GpuMemory(total / 1024, free / 1024)
    return memory


def gpu_memory(gpus: Sequence[int]) -> dict[int, capacity.GpuMemory]:
    """Total and free memory of each of `gpus` now, from `nvidia-smi`; empty where it cannot tell."""
    query = ["nvidia-smi", "--query-gpu=index,memory.total,memory.free", "--format=csv,noheader,nounits"]
    try:
        result = subprocess.run(query, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    memory = parse_nvidia_smi(result.stdout) if result.returncode == 0 else {}
    return {gpu: memory[gpu] for gpu in gpus if gpu in memory}


def fleet_gpu(gpus: Sequence[int], target: CapacityTarget) -> capacity.GpuMemory | None:
    """The memory every server of the fleet can count on: the GPU with the least free memory, or the operator's
    figure (then the total is taken as measured, or as the figure plus a CUDA context)."""
    measured = gpu_memory(gpus)
    tightest = min(measured.values(), key=lambda gpu: gpu.free_gib) if len(measured) == len(gpus) else None
    if target.gpu_memory_gib is None:
        return tightest
    total = tightest.total_gib if tightest else target.gpu_memory_gib + capacity.CUDA_CONTEXT_GIB
    return capacity.GpuMemory(total, target.gpu_memory_gib)


def plan_capacity(
    options: ServerOptions, target: CapacityTarget, gpu: capacity.GpuMemory | None
) -> tuple[ServerOptions, capacity.LaunchPlan | None]:
    """The options to launch with and the plan they come from.

    Unless the operator sized the servers (`ServerOptions.sized_by_hand`), the cap is planned for the GPU's
    memory and the expected request length (`capacity.plan_for_gpu`): radix cache off, `--max-running-requests`
    at the balance of the two pools; with the radix cache kept, a `--mamba-full-memory-ratio` with it. A
    server sized by hand gets the plan of what it will compute, when the GPU's memory is known.
    """
    settings = options.launch_settings()
    tokens = target.tokens_per_request(settings)
    if options.sized_by_hand:
        if gpu is None:
            return options, None
        budget, fraction = capacity.gpu_budget_bytes(gpu, settings, mem_fraction_static=options.mem_fraction_static)
        try:
            pools = capacity.size_pools(budget, settings)
        except ValueError as exc:
            raise FleetError(f"these flags would not start on a GPU with {gpu.free_gib:.1f} GiB free: {exc}") from None
        return options, capacity.LaunchPlan(settings, (), pools, tokens, mem_fraction_static=fraction)
    if gpu is None:
        raise FleetError(
            "cannot plan --max-running-requests: nvidia-smi does not report the GPUs' memory. Pass "
            "--gpu-memory-gib (GiB free per GPU), or size the servers with --max-running-requests"
        )
    plan = capacity.plan_for_gpu(
        gpu,
        tokens,
        settings,
        mem_fraction_static=options.mem_fraction_static,
        radix_cache=options.radix_cache,
        margin=PLAN_MARGIN,
    )
    planned = replace(options, max_running_requests=plan.settings.max_running_requests)
    if options.radix_cache:
        planned = replace(planned, mamba_full_memory_ratio=plan.settings.mamba_full_memory_ratio)
    return planned, plan


# What a simulator's memory model is sized by; with none of them given, `plan_simulators` plans the cap.
SIM_CAPACITY_OPTIONS = (
    "max_running_requests",
    "effective_max_running_requests",
    "mamba_full_memory_ratio",
    "max_mamba_cache_size",
)


def plan_simulators(
    options: Mapping[str, Any], target: CapacityTarget
) -> tuple[dict[str, Any], capacity.LaunchPlan | None]:
    """Simulators with a memory model (`gpu_memory_gb`) are planned like GPUs: with no capacity option of their
    own they launch at the ceiling (radix cache off, the planned `max_running_requests`), as `fleet up` launches
    real servers; otherwise the plan says what they will compute. Without a memory model there is nothing to
    plan."""
    from dagster_project.sglang.sim.config import SimConfig

    options = dict(options)
    if options.get("gpu_memory_gb") is None:
        return options, None
    known = {f.name for f in dataclasses.fields(SimConfig)}
    config = SimConfig(**{name: value for name, value in options.items() if name in known})
    budget = capacity.pool_budget_bytes(config.gpu_memory_gb, config.weights_gb, config.mem_fraction_static)
    settings = config.launch_settings
    tokens = target.tokens_per_request(settings)
    if any(options.get(name) is not None for name in SIM_CAPACITY_OPTIONS):
        pools = capacity.size_pools(budget, settings)
        return options, capacity.LaunchPlan(settings, (), pools, tokens, mem_fraction_static=config.mem_fraction_static)
    plan = capacity.plan_launch(budget, tokens, settings, radix_cache=False)
    plan = replace(plan, mem_fraction_static=config.mem_fraction_static)
    options.update(disable_radix_cache=True, max_running_requests=plan.settings.max_running_requests)
    return options, plan


def sim_spec_options(setting: SpecSetting | None) -> dict[str, Any]:
    """The simulator options (`SimConfig` fields) that serve a speculative setting (None: MTP off)."""
    if setting is None:
        return {"speculative": False}
    return {
        "speculative": True,
        "speculative_num_steps": setting.steps,
        "speculative_eagle_topk": setting.topk,
        "spec_draft_tokens": setting.draft_tokens,
    }


def server_spec_options(setting: SpecSetting | None) -> dict[str, Any]:
    """The `ServerOptions` that launch a real server with a speculative setting (None: MTP off)."""
    return {"speculative": spec_label(setting)}


def describe_plan(plan: capacity.LaunchPlan | None) -> str:
    """One line: the cap a launch is planned for and why."""
    if plan is None:
        return "plan: none (no GPU memory model: the servers size themselves)"
    pools = plan.pools
    flags = f"`{' '.join(plan.flags)}`" if plan.flags else "the flags given"
    fraction = f", mem fraction {plan.mem_fraction_static:.3f}" if plan.mem_fraction_static else ""
    return (
        f"plan: cap {plan.cap} per server with {flags}{fraction}; state pool {pools.state_bytes / capacity.GIB:.1f} "
        f"GiB, KV pool {pools.max_total_num_tokens:,} tokens; {plan.concurrency} run at once at "
        f"{plan.tokens_per_request:,.0f} tokens/request"
    )


def capacity_report(
    urls: Sequence[str],
    plan: capacity.LaunchPlan | None,
    target: CapacityTarget,
    api_key: str | None = None,
) -> list[str]:
    """Per server, the cap it computed (`capacity.analyze` of its `/server_info`) next to the plan's."""
    from dagster_project.sglang.client import SGLangError

    infos = asyncio.run(server_infos(urls, api_key))
    lines = []
    for url, info in zip(urls, infos):
        if isinstance(info, SGLangError):
            lines.append(f"{url}: no /server_info ({info})")
            continue
        try:
            report = capacity.analyze(info, target.expected_prompt_tokens, target.expected_output_tokens)
        except (KeyError, TypeError, ValueError) as exc:
            lines.append(f"{url}: /server_info lacks the capacity fields ({exc!r})")
            continue
        line = f"{url}: {report.explain('expected')}"
        if plan is not None and report.cap != plan.cap:
            line += (
                f"  [differs from the plan's cap {plan.cap}: the server found other memory than planned; "
                "its log's 'avail mem' and 'max_total_num_tokens' lines say how much]"
            )
        lines.append(line)
    return lines


async def server_infos(urls: Sequence[str], api_key: str | None) -> list[dict | SGLangError]:
    from dagster_project.sglang.client import SGLangClient, SGLangError, new_session

    async with new_session() as session:

        async def one(url: str) -> dict | SGLangError:
            try:
                return await SGLangClient(url, api_key=api_key, session=session).server_info()
            except SGLangError as error:
                return error

        return list(await asyncio.gather(*(one(url) for url in urls)))
