"""A `/server_info` body of SGLang 0.5.23 for a server of a given launch and memory, for the capacity tests."""

from __future__ import annotations

from dagster_project.sglang.capacity import GIB, QWEN3_6_27B, LaunchSettings, decode_cuda_graph_bs, size_pools

# The H200 budget of tests/unit/sglang/test_capacity.py: 139.4 GiB free, 52.31 GiB of weights, fraction 0.824.
H200_BUDGET = 67_063_706_445


def server_info_for(settings: LaunchSettings, budget: int = H200_BUDGET) -> dict:
    """The body (entrypoints/http_server.py:853-893, internal_state.py:45-130) of a server launched with
    `settings` on `budget`, with the fields the capacity model and the startup check read."""
    pools = size_pools(budget, settings)
    return {
        "context_length": settings.context_length,
        "max_running_requests": settings.configured_max_running_requests,
        "mamba_full_memory_ratio": settings.mamba_full_memory_ratio,
        "max_mamba_cache_size": settings.max_mamba_cache_size,
        "disable_radix_cache": settings.disable_radix_cache,
        "mamba_radix_cache_strategy": settings.mamba_radix_cache_strategy,
        "disable_overlap_schedule": False,
        "speculative_algorithm": "EAGLE" if settings.speculative else None,
        "speculative_num_draft_tokens": settings.speculative_draft_tokens or None,
        "mamba_ssm_dtype": None,
        "kv_cache_dtype": "auto",
        "page_size": 1,
        "max_total_num_tokens": pools.max_total_num_tokens,
        "max_req_input_len": min(settings.context_length - 1, pools.max_total_num_tokens - 1) - 5,
        "internal_states": [
            {
                "max_mamba_cache_size": pools.max_mamba_cache_size,
                "effective_max_running_requests_per_dp": pools.max_running_requests,
                "memory_usage": {"weight": QWEN3_6_27B.weights_gib, "kvcache": round(pools.kv_bytes / GIB, 3)},
                "decode_cuda_graph_bs": decode_cuda_graph_bs(settings, pools.max_running_requests),
            }
        ],
    }
