"""What the ops routes report: the bodies of /model_info, /v1/models and /server_info, the /metrics
exposition, and the request counters behind them.

Static values (memory figures, cuda-graph sizes, ...) are plausible numbers for Qwen3.6-27B on one H200;
the dynamic ones (running and queued requests, token usage, throughput, spec acceptance) are live.
"""

from __future__ import annotations

import bisect
import math
import os
import sys
from collections import deque
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.sim.config import SGLANG_VERSION, SimConfig

if TYPE_CHECKING:
    from dagster_project.sglang.sim.scheduler import Scheduler

_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
_MAMBA_SLOTS_PER_REQUEST = 5  # S of the default extra_buffer radix strategy: sizes the mamba pool


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
    cap = scheduler.cap
    spec = "EAGLE" if c.speculative else None  # NEXTN resolves to EAGLE, and /server_info says so
    state: dict[str, Any] = {
        "speculative_algorithm": spec,
        "max_mamba_cache_size": cap * _MAMBA_SLOTS_PER_REQUEST,
        "world_size": 1,
        "effective_max_running_requests_per_dp": cap,
        "last_gen_throughput": scheduler.gen_throughput(),
        "memory_usage": {
            "weight": 52.31,
            "kvcache": 16.2,
            "startup_available": 139.23,
            "token_capacity": c.token_capacity,
            "token_capacity_swa": None,
            "graph": {"decode": 0.0, "target_verify": 1.1, "draft_decode": 0.4, "draft_extend": 0.3},
        },
        "disaggregation_mode": "null",
        "decode_cuda_graph_bs": [bs for bs in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128) if bs <= cap],
        "decode_cuda_graph_memory_gb": 1.8,
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
        "mem_fraction_static": 0.88,
        "max_running_requests": c.max_running_requests,
        "max_queued_requests": c.max_queued_requests,
        "chunked_prefill_size": 8192,
        "kv_cache_dtype": "auto",
        "speculative_algorithm": spec,
        "speculative_num_steps": c.spec_draft_tokens - 1 if c.speculative else None,
        "speculative_eagle_topk": 1 if c.speculative else None,
        "speculative_num_draft_tokens": c.spec_draft_tokens if c.speculative else None,
        "mamba_ssm_dtype": None,
        "max_mamba_cache_size": None,
        "mamba_full_memory_ratio": 0.9,
        "mamba_radix_cache_strategy": "extra_buffer",
        "disable_radix_cache": False,
        "reasoning_parser": c.reasoning_parser,
        "enable_metrics": c.enable_metrics,
        "weight_version": "default",
        "api_key": c.api_key,  # the real server does not redact it either
        "launch_command": "python -m dagster_project.sglang.sim.server " + " ".join(_redacted_argv()),
        "status": "ready",
        "max_total_num_tokens": c.token_capacity,
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
    used = scheduler.used_tokens()
    full_usage = used / config.token_capacity
    mamba_usage = scheduler.running / (scheduler.cap * _MAMBA_SLOTS_PER_REQUEST)
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
    out.gauge("num_retracted_reqs", 0, {**labels, "pid": str(os.getpid())})  # mode "all": one series per process
    out.gauge("max_total_num_tokens", config.token_capacity, labels)
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
