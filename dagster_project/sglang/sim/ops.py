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
from collections.abc import Iterator
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from dagster_project.sglang import capacity
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.sim.config import SGLANG_VERSION, SimConfig

if TYPE_CHECKING:
    from dagster_project.sglang.sim.scheduler import Scheduler

_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
# CUDA-graph memory per phase, every phase named as 0.5.23 names them (0 where none is captured).
_GRAPH_MEMORY_GB = {
    "prefill": 0.0,
    "decode": 0.0,
    "target_verify": 1.1,
    "draft_prefill": 0.0,
    "draft_decode": 0.4,
    "draft_extend": 0.3,
}
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
        "has_image_understanding": config.architecture.endswith("ForConditionalGeneration"),  # Qwen3.6: a VLM
        "has_audio_understanding": False,
        "model_type": config.model_type,
        "architectures": [config.architecture],
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
        "speculative_num_steps": c.speculative_num_steps if c.speculative else None,
        "speculative_eagle_topk": c.speculative_eagle_topk if c.speculative else None,
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
        # Seconds per startup phase (a dict, not a number); a simulator starts at once.
        "startup_time": {
            "load_weight": 0.0,
            "kv_cache_allocation": 0.0,
            "scheduler_e2e": 0.0,
            "cuda_graph": dict.fromkeys(_GRAPH_MEMORY_GB, 0.0),
            "tokenizer_e2e": 0.0,
        },
        "internal_states": [state],
        "version": SGLANG_VERSION,
        "frontend": "python",
    }


class SimMetrics(Collector):
    """The /metrics families, read from the scheduler and the counters at each scrape, as SGLang 0.5.23 names,
    labels and documents them (one TP rank, no DP). Rendered by prometheus_client like SGLang's multiprocess
    registry: counters and histograms carry no `_created` series."""

    def __init__(self, config: SimConfig, scheduler: Scheduler, stats: Stats) -> None:
        self.config, self.scheduler, self.stats = config, scheduler, stats
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()

    def collect(self) -> Iterator[Metric]:
        config, scheduler, stats = self.config, self.scheduler, self.stats
        scheduler_labels = {
            "engine_type": "unified",
            "model_name": config.model_name,
            "moe_ep_rank": "0",
            "pp_rank": "0",
            "tp_rank": "0",
        }
        tokenizer = {"engine_type": "unified", "model_name": config.model_name}
        streaming = {**tokenizer, "is_streaming": "false"}
        pools = config.pools
        used = scheduler.used_tokens()
        full_usage = used / pools.max_total_num_tokens
        # Running requests' state slots; the draft snapshots have their own buffer.
        mamba_usage = scheduler.running * config.launch_settings.state_slots_per_request / pools.max_mamba_cache_size
        gauges = {
            "num_running_reqs": scheduler.running,
            "num_queue_reqs": len(scheduler.waiting),
            "gen_throughput": scheduler.gen_throughput(),
            "cache_hit_rate": 0.0,
            "token_usage": max(full_usage, mamba_usage),
            "full_token_usage": full_usage,
            "mamba_usage": mamba_usage,
            "num_used_tokens": used,
        }
        # The spec gauges are there with speculative decoding off too, at 0, as SGLang's are.
        tokens, verify, correct = (
            (sum(column) for column in zip(*stats.spec_window)) if stats.spec_window else (0, 0, 0)
        )
        draft = config.spec_draft_tokens if config.speculative else 0
        gauges["spec_accept_length"] = tokens / verify if verify else 0.0
        gauges["spec_accept_rate"] = correct / (verify * (draft - 1)) if verify else 0.0
        gauges["spec_num_steps"] = config.speculative_num_steps if config.speculative else 0
        gauges["spec_num_draft_tokens"] = draft
        for name, value in gauges.items():
            yield _gauge(name, value, scheduler_labels)
        retracted = sum(1 for job in scheduler.waiting if job.retractions)
        # Retraction mode "all": a series per process.
        yield _gauge("num_retracted_reqs", retracted, {**scheduler_labels, "pid": str(os.getpid())})
        # Labelled counters without a sample until their first event, as prometheus_client shows SGLang's.
        if scheduler.retracted:
            yield _counter("num_retracted_requests", scheduler.retracted, scheduler_labels)
        yield _gauge("new_token_ratio", scheduler.new_token_ratio(), scheduler_labels)
        yield _gauge("max_total_num_tokens", pools.max_total_num_tokens, scheduler_labels)
        yield _gauge("context_len", config.context_length, scheduler_labels)
        counters = stats.counters
        yield _counter("prompt_tokens", counters["prompt_tokens"], streaming)
        yield _counter("generation_tokens", counters["generation_tokens"], streaming)
        yield _counter("num_requests", counters["requests"], streaming)
        if counters["aborted"]:
            yield _counter("num_aborted_requests", counters["aborted"], tokenizer)
        if config.speculative:
            yield _counter("spec_verify_calls", counters["verify_calls"], tokenizer)
        latency = HistogramMetricFamily(
            f"sglang:{_E2E_LATENCY}", proto.METRIC_HELP[_E2E_LATENCY], labels=list(streaming)
        )
        buckets = [
            (floatToGoString(bound), count)
            for bound, count in zip([*_E2E_BUCKETS, math.inf], accumulate(stats.e2e_counts))
        ]
        latency.add_metric(list(streaming.values()), buckets, stats.e2e_sum)
        yield latency


_E2E_LATENCY = "e2e_request_latency_seconds"


def _gauge(name: str, value: float, labels: dict[str, str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"sglang:{name}", proto.METRIC_HELP[name], labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _counter(name: str, value: float, labels: dict[str, str]) -> CounterMetricFamily:
    """`name` without `_total`: the exposition adds it, as prometheus_client does for every counter."""
    family = CounterMetricFamily(f"sglang:{name}", proto.METRIC_HELP[f"{name}_total"], labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _redacted_argv() -> list[str]:
    argv = list(sys.argv[1:])
    for index, arg in enumerate(argv[:-1]):
        if arg == "--api-key":
            argv[index + 1] = "<redacted>"
    return argv
