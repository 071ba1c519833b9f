"""What the ops routes report: the bodies of /model_info, /v1/models and /server_info, the /metrics
exposition, and the request counters behind them.

The capacity fields (pools, cap, memory, CUDA-graph sizes) are the server's sizing (`SimConfig.pools`), under
0.5.23's names, so that `capacity.analyze` reads a simulator as it reads a real server; the dynamic ones
(running and queued requests, token usage, throughput, spec acceptance) are live.
"""

from __future__ import annotations

import bisect
import math
import os
import sys
from collections import deque
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from dagster_project.sglang import capacity
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.sim.config import SGLANG_VERSION, SimConfig

if TYPE_CHECKING:
    from dagster_project.sglang.sim.scheduler import Scheduler

_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
_GRAPH_MEMORY_GB = {"decode": 0.0, "target_verify": 1.1, "draft_decode": 0.4, "draft_extend": 0.3}
_FREE_GB = 139.4  # GPU memory free before the weights load on an H200, for a server with given pools


class Stats:
    """Counters of finished requests, as SGLang's tokenizer-side metrics count them."""

    def __init__(self) -> None:
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "requests": 0, "aborted": 0, "verify_calls": 0}
        self.e2e_counts = [0] * (len(_E2E_BUCKETS) + 1)
        self.e2e_sum = 0.0
        self.spec_totals = [0, 0]  # accepted tokens incl. bonus, verify passes: since start or last flush
        # The latest requests' (tokens, verify, correct) stand in for SGLang's window of decode steps.
        self.spec_window: deque[tuple[int, int, int]] = deque(maxlen=64)

    def record_finish(self, prompt_tokens: int, completion: int, e2e: float) -> None:
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += prompt_tokens
        self.counters["generation_tokens"] += completion
        self.e2e_counts[bisect.bisect_left(_E2E_BUCKETS, e2e)] += 1
        self.e2e_sum += e2e

    def record_spec(self, completion: int, verify: int, correct: int) -> None:
        self.counters["verify_calls"] += verify
        self.spec_totals[0] += completion
        self.spec_totals[1] += verify
        self.spec_window.append((completion, verify, correct))

    def flush(self) -> None:
        """/flush_cache restarts the spec averages."""
        self.spec_totals = [0, 0]
        self.spec_window.clear()


def model_info(config: SimConfig) -> dict:
    return {
        "model_path": config.model_path,
        "served_model_name": config.model_name,
        "tokenizer_path": config.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": config.reasoning_parser,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": True,
        "has_audio_understanding": False,
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
    }


def models(config: SimConfig, created: float) -> dict:
    card = {
        "id": config.model_name,
        "object": "model",
        "created": int(created),
        "owned_by": "sglang",
        "root": config.model_path,
        "parent": None,
        "max_model_len": config.context_length,
    }
    return {"object": "list", "data": [card]}


def server_info(config: SimConfig, scheduler: Scheduler, stats: Stats) -> dict:
    c = config
    pools, settings = c.pools, c.launch_settings
    spec = "EAGLE" if c.speculative else None  # NEXTN resolves to EAGLE, and /server_info says so
    graph_gb = sum(_GRAPH_MEMORY_GB.values())
    pools_gb = (pools.state_bytes + pools.kv_bytes) / capacity.GIB
    state: dict[str, Any] = {
        "speculative_algorithm": spec,
        "max_mamba_cache_size": pools.max_mamba_cache_size,  # the scheduler's computed value
        "world_size": 1,
        "effective_max_running_requests_per_dp": pools.max_running_requests,
        "last_gen_throughput": scheduler.gen_throughput(),
        "memory_usage": {
            "weight": c.weights_gb,
            "kvcache": round(pools.kv_bytes / capacity.GIB, 3),
            "startup_available": round((c.gpu_memory_gb or _FREE_GB) - c.weights_gb - pools_gb - graph_gb, 3),
            "token_capacity": pools.max_total_num_tokens,
            "token_capacity_swa": None,
            "graph": _GRAPH_MEMORY_GB,
        },
        "disaggregation_mode": "null",
        "decode_cuda_graph_bs": capacity.decode_cuda_graph_bs(settings, pools.max_running_requests),
        "decode_cuda_graph_memory_gb": round(graph_gb, 3),
    }
    if c.speculative and stats.spec_totals[1]:  # absent until the first decode window, like SGLang's
        state["avg_spec_accept_length"] = stats.spec_totals[0] / stats.spec_totals[1]
    return {
        "model_path": c.model_path,
        "served_model_name": c.model_name,
        "tokenizer_path": c.model_path,
        "host": c.host,
        "port": c.port,
        "tp_size": 1,
        "dp_size": 1,
        "base_gpu_id": 0,
        "context_length": c.context_length,
        "mem_fraction_static": c.mem_fraction_static,
        "max_running_requests": settings.configured_max_running_requests,  # resolved, not the cap in force
        "max_queued_requests": c.max_queued_requests,
        "chunked_prefill_size": 8192,
        "page_size": 1,
        "kv_cache_dtype": c.kv_cache_dtype,
        "speculative_algorithm": spec,
        "speculative_num_steps": c.spec_draft_tokens - 1 if c.speculative else None,
        "speculative_eagle_topk": 1 if c.speculative else None,
        "speculative_num_draft_tokens": c.spec_draft_tokens if c.speculative else None,
        "mamba_ssm_dtype": c.mamba_ssm_dtype,
        "max_mamba_cache_size": c.max_mamba_cache_size,  # the flag; internal_states has the computed size
        "mamba_full_memory_ratio": c.mamba_full_memory_ratio,
        "mamba_radix_cache_strategy": "auto" if c.disable_radix_cache else c.mamba_radix_cache_strategy,  # unresolved
        "disable_radix_cache": c.disable_radix_cache,
        "disable_overlap_schedule": False,
        "reasoning_parser": c.reasoning_parser,
        "enable_metrics": c.enable_metrics,
        "weight_version": "default",
        "api_key": c.api_key,  # the real server does not redact it either
        "launch_command": "python -m dagster_project.sglang.sim.server " + " ".join(_redacted_argv()),
        "status": "ready",
        "max_total_num_tokens": pools.max_total_num_tokens,
        "max_req_input_len": c.max_req_input_len,
        "startup_time": 0.0,
        "internal_states": [state],
        "version": SGLANG_VERSION,
        "frontend": "python",
    }


def exposition(config: SimConfig, scheduler: Scheduler, stats: Stats) -> str:
    """/metrics text: SGLang's names and labels of the scheduler and tokenizer metrics."""
    name = config.model_name
    labels = {"engine_type": "unified", "model_name": name, "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
    tokenizer = {"engine_type": "unified", "model_name": name}
    streaming = {**tokenizer, "is_streaming": "false"}
    pools = config.pools
    used = scheduler.used_tokens()
    full_usage = used / pools.max_total_num_tokens
    # Running requests' state slots; the draft snapshots have their own buffer.
    mamba_usage = scheduler.running * config.launch_settings.state_slots_per_request / pools.max_mamba_cache_size
    out = proto.Exposition()
    out.gauge("num_running_reqs", scheduler.running, labels)
    out.gauge("num_queue_reqs", len(scheduler.waiting), labels)
    out.gauge("gen_throughput", scheduler.gen_throughput(), labels)
    out.gauge("cache_hit_rate", 0.0, labels)
    out.gauge("token_usage", max(full_usage, mamba_usage), labels)
    out.gauge("full_token_usage", full_usage, labels)
    out.gauge("mamba_usage", mamba_usage, labels)
    out.gauge("num_used_tokens", used, labels)
    if config.speculative:
        tokens, verify, correct = (
            (sum(column) for column in zip(*stats.spec_window)) if stats.spec_window else (0, 0, 0)
        )
        draft = config.spec_draft_tokens
        out.gauge("spec_accept_length", tokens / verify if verify else 0.0, labels)
        out.gauge("spec_accept_rate", correct / (verify * (draft - 1)) if verify else 0.0, labels)
        out.gauge("spec_num_steps", draft - 1, labels)
        out.gauge("spec_num_draft_tokens", draft, labels)
    retracted = sum(1 for job in scheduler.waiting if job.retractions)
    out.gauge("num_retracted_reqs", retracted, {**labels, "pid": str(os.getpid())})  # mode "all": a series per process
    out.counter("num_retracted_requests_total", scheduler.retracted, labels)
    out.gauge("new_token_ratio", scheduler.new_token_ratio(), labels)
    out.gauge("max_total_num_tokens", pools.max_total_num_tokens, labels)
    out.gauge("context_len", config.context_length, labels)
    counters = stats.counters
    out.counter("prompt_tokens_total", counters["prompt_tokens"], streaming)
    out.counter("generation_tokens_total", counters["generation_tokens"], streaming)
    out.counter("num_requests_total", counters["requests"], streaming)
    out.counter("num_aborted_requests_total", counters["aborted"], tokenizer)
    if config.speculative:
        out.counter("spec_verify_calls_total", counters["verify_calls"], tokenizer)
    buckets = list(zip([*_E2E_BUCKETS, math.inf], accumulate(stats.e2e_counts)))
    out.histogram("e2e_request_latency_seconds", buckets, stats.e2e_sum, streaming)
    return out.text()


def _redacted_argv() -> list[str]:
    argv = list(sys.argv[1:])
    for index, arg in enumerate(argv[:-1]):
        if arg == "--api-key":
            argv[index + 1] = "<redacted>"
    return argv
