"""The capacity model against SGLang 0.5.23's own sizing, with numbers taken from its code.

Every `path:line` below is in the sglang 0.5.23 wheel (`pip download --no-deps sglang==0.5.23`, unzipped),
relative to `sglang/srt/`. The sizing chain for a hybrid model:

1. `_profile_available_bytes` (mem_cache/kv_cache_configurator.py:2990-3060): the budget is the memory free
   after the weights load, less `free_before_load × (1 − mem_fraction_static)` and the multimodal reserve
   (SGLANG_VLM_CACHE_SIZE_MB = 100, environ.py:1598; mem_cache/kv_cache_configurator.py:202-219).
2. `_handle_max_mamba_cache` (mem_cache/kv_cache_configurator.py:3229-3409) carves the mamba state pool out
   of it: `--max-mamba-cache-size` as given (3303-3324), exactly `--max-running-requests` slots with the radix
   cache off (3325-3344), else `ratio / (1 + ratio)` of the budget (3345-3386), solved jointly with the
   draft-token SSM snapshots under speculative decoding (3359-3377); it returns the budget less the state
   pool (3404-3409).
3. The rest is KV: `bytes // cell size` tokens (model_executor/pool_configurator.py:637-647; the cell counts
   the MTP draft layer under EAGLE, pool_configurator.py:259-314).
4. `resolve_max_num_reqs` (mem_cache/kv_cache_configurator.py:3119-3172): the cap is
   `min(configured or an estimate in [2048, 4096], tokens // 2, slots // slots per request)`.

The slots a request holds: 1 with `--disable-radix-cache`, else 3 (kv_cache_configurator.py:222-229) plus
the extra_buffer tracking slots, 2 with the overlap scheduler (allocation_sizing.py:11-19;
`_calculate_mamba_ratio`, kv_cache_configurator.py:3062-3088). Speculative decoding sets the configured
maximum to 48 when unset (arg_groups/speculative_hook.py:1086-1094).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dagster_project.sglang import capacity
from dagster_project.sglang.capacity import (
    QWEN3_6_27B,
    LaunchSettings,
    Resource,
    analyze,
    decode_cuda_graph_bs,
    plan_launch,
    pool_budget_bytes,
    size_pools,
)
from tests.support.server_info import server_info_for

# One state slot of Qwen3.6-27B (configs/mamba_utils.py:116-125 `mamba_cache_per_req`, shapes from
# configs/qwen3_next.py:287-313 and configs/mamba_utils.py:195-243): per GDN layer a bf16 conv state of
# (48·128 + 2·16·128) × 3 = 30,720 values and an SSM state of 48 × 128 × 128 = 786,432 values, 48 layers.
SLOT_FP32 = (30_720 * 2 + 786_432 * 4) * 48  # 153,944,064 B
SLOT_BF16 = (30_720 * 2 + 786_432 * 2) * 48  # 78,446,592 B
# KV per token: 16 full-attention layers × K,V × 4 heads × 256 × 2 B, + 1/16 of it for the MTP layer.
CELL_MTP = 16 * 2 * 4 * 256 * 2 + 4096  # 69,632 B
CELL = 16 * 2 * 4 * 256 * 2  # 65,536 B without speculative decoding

# One H200 (143,771 MiB) with the launch defaults. The free memory before the weights load and the weights'
# size are measurements (boot log "avail mem" and "mem usage"); these are typical values. The auto
# --mem-fraction-static (arg_groups/memory_hook.py:281-342): reserve 512 + 8192 × 1.5 + 128 + graph reserve
# (decode max bs 48 × 2 + 58 prefill token buckets × 8, memory_hook.py:357-399) = 13,488 MiB →
# round(130,283 / 143,771, 3) = 0.906, times the VLM factor 0.95 × (1 − 0.1 × (27·1152² / (24·1024²) − 1)) =
# 0.9097 (memory_hook.py:417-462) = 0.824.
FREE_GIB, WEIGHTS_GIB, MEM_FRACTION = 139.4, 52.31, 0.824
# 139.4 − 52.31 − 139.4 × 0.176 − 100/1024 = 62.4579 GiB
BUDGET = 67_063_706_445


def test_per_request_state_and_per_token_kv_sizes():
    assert QWEN3_6_27B.state_bytes_per_slot() == SLOT_FP32 == 153_944_064
    assert QWEN3_6_27B.state_bytes_per_slot("bfloat16") == SLOT_BF16 == 78_446_592
    assert QWEN3_6_27B.kv_bytes_per_token() == CELL_MTP == 69_632
    assert QWEN3_6_27B.kv_bytes_per_token(speculative=False) == CELL
    assert QWEN3_6_27B.kv_bytes_per_token("fp8_e4m3") == CELL_MTP // 2


def test_the_budget_is_what_the_weights_and_the_runtime_slack_leave():
    assert pool_budget_bytes(FREE_GIB, WEIGHTS_GIB, MEM_FRACTION) == BUDGET
    with pytest.raises(ValueError, match="no memory for the pools"):
        pool_budget_bytes(60.0, 52.31, 0.85)


@pytest.mark.parametrize(
    ("settings", "slots", "tokens", "cap", "bound"),
    [
        # Defaults (NEXTN 3/1/4, everything else unset): 5 slots per request, ratio 0.9, configured 48.
        # State share BUDGET × 0.9/1.9 = 31,767,018,842 B; slots ⌊(31,767,018,842 − 153,944,064 × 5) /
        # (153,944,064 × (1 + 4/5))⌋ = ⌊111.86⌋ = 111 (kv_cache_configurator.py:3363-3369); state pool
        # (111 + 1) slots + (min(48, 111 // 5 = 22) + 1) × 4 snapshots (3370-3377, 3404-3408)
        # = 204 × 153,944,064 B; KV tokens (BUDGET − 31,404,589,056) // 69,632 = 512,108;
        # cap min(48, 256,054, 22) = 22, set by the mamba slots (3134-3150).
        (LaunchSettings(), 111, 512_108, 22, Resource.MAMBA_SLOTS),
        # --mamba-full-memory-ratio 2.5: share × 2.5/3.5 → ⌊170.09⌋ = 170 slots, cap 170 // 5 = 34;
        # 171 + 35 × 4 = 311 slot sizes of state leave 275,550 tokens.
        (LaunchSettings(mamba_full_memory_ratio=2.5), 170, 275_550, 34, Resource.MAMBA_SLOTS),
        # --disable-radix-cache --max-running-requests 64: the pool is exactly 64 slots (3324-3346), 1 per
        # request; state (64 + 1) × (1 + 4) slot sizes = 50,031,820,800 B leave 244,598 tokens; cap 64.
        (LaunchSettings(disable_radix_cache=True, max_running_requests=64), 64, 244_598, 64, Resource.CONFIGURED),
        # No speculative decoding: no snapshots, slots ⌊31,767,018,842 / 153,944,064 − 1⌋ = 205
        # (3378-3386), KV cell 65,536 → 539,416 tokens; nothing configured, so the estimate
        # max(min(539,416 / 65,536 × 512, 4096), 2048) = 4096 (3122-3132) yields to 205 // 5 = 41.
        (LaunchSettings(speculative_draft_tokens=0), 205, 539_416, 41, Resource.MAMBA_SLOTS),
    ],
    ids=["defaults", "ratio-2.5", "radix-off-64", "no-speculative"],
)
def test_size_pools_reproduces_the_cap_of_0_5_23(settings, slots, tokens, cap, bound):
    pools = size_pools(BUDGET, settings)
    assert (pools.max_mamba_cache_size, pools.max_total_num_tokens) == (slots, tokens)
    assert (pools.max_running_requests, pools.bound) == (cap, bound)
    cell = CELL_MTP if settings.speculative else CELL
    assert pools.state_bytes + tokens * cell <= BUDGET < pools.state_bytes + (tokens + 1) * cell


def test_slots_per_request_follow_the_radix_strategy():
    assert LaunchSettings().state_slots_per_request == 5
    assert LaunchSettings(overlap_schedule=False).state_slots_per_request == 4
    assert LaunchSettings(mamba_radix_cache_strategy="extra_buffer_lazy").state_slots_per_request == 4
    assert LaunchSettings(mamba_radix_cache_strategy="no_buffer").state_slots_per_request == 3
    assert LaunchSettings(disable_radix_cache=True).state_slots_per_request == 1


def test_explicit_state_pool_and_the_other_binding_limits():
    # --max-mamba-cache-size 200 (kv_cache_configurator.py:3303-3324): 200 // 5 = 40 below the configured 48.
    pools = size_pools(BUDGET, LaunchSettings(max_mamba_cache_size=200))
    assert (pools.max_mamba_cache_size, pools.max_running_requests, pools.bound) == (200, 40, Resource.MAMBA_SLOTS)
    # A cap asked for above what the slots give is still capped by them.
    pools = size_pools(BUDGET, LaunchSettings(max_running_requests=500, mamba_full_memory_ratio=4.0))
    assert pools.bound is Resource.MAMBA_SLOTS and pools.max_running_requests < 500
    # The configured maximum binds when the slots allow more.
    pools = size_pools(BUDGET, LaunchSettings(max_running_requests=16, disable_radix_cache=True))
    assert (pools.max_running_requests, pools.bound) == (16, Resource.CONFIGURED)
    with pytest.raises(ValueError, match="leaves no KV tokens"):  # 96 radix-off requests do not fit an H200
        size_pools(BUDGET, LaunchSettings(disable_radix_cache=True, max_running_requests=96))
    with pytest.raises(ValueError, match="serve no request"):  # fewer slots than one request needs
        size_pools(BUDGET, LaunchSettings(max_mamba_cache_size=4))


def test_decode_cuda_graph_batch_sizes():
    # Spec decoding's list (arg_groups/cuda_graph_hook.py:517-530), clamped to the configured 48
    # (memory_hook.py:182-188) and to the pool (model_executor/runner/base_cuda_graph_runner.py:92-102).
    assert decode_cuda_graph_bs(LaunchSettings(), 48)[-4:] == [32, 40, 44, 48]
    sizes = decode_cuda_graph_bs(LaunchSettings(), 22)
    assert sizes[:8] == list(range(1, 9)) and sizes[-2:] == [20, 22]
    assert max(decode_cuda_graph_bs(LaunchSettings(cuda_graph_max_bs=16), 22)) == 16
    assert max(decode_cuda_graph_bs(LaunchSettings(max_running_requests=96), 96)) == 96


def server_info(settings: LaunchSettings, budget: int = BUDGET) -> dict:
    return server_info_for(settings, budget)


def test_analyze_names_the_binding_resource_and_the_headroom():
    report = analyze(server_info(LaunchSettings()), prompt_tokens=600, output_tokens=2000)
    assert (report.cap, report.cap_bound, report.bound, report.concurrency) == (22, *[Resource.MAMBA_SLOTS] * 2, 22)
    assert report.tokens_per_request == 2604  # prompt + output + the 4 reserved draft tokens
    assert report.limits[Resource.KV_AT_LENGTHS] == 512_108 // 2604 == 196
    assert report.limits[Resource.CONFIGURED] == 48
    best = report.best
    assert best is not None and best.flags == ("--disable-radix-cache", "--max-running-requests", "69")
    assert report.headroom == pytest.approx(69 / 22)
    assert report.explain() == (
        "cap 22 per server, bound by mamba state slots (5 per request, radix cache on); KV pool allows 196 at the "
        "observed 2.6K tokens/request; `--disable-radix-cache --max-running-requests 69` → est. ×3.1"
    )
    # The options share the server's memory: re-sizing it under the current flags gives the current pools.
    rebuilt = capacity.ServerState.from_server_info(server_info(LaunchSettings())).budget_bytes()
    assert size_pools(rebuilt, LaunchSettings()) == size_pools(BUDGET, LaunchSettings())
    assert [option.note != "" for option in report.options].count(True) == 1  # the bf16 state, flagged
    lines = report.describe().splitlines()
    assert lines[0] == report.explain() and "  mamba state slots: 22" in lines
    assert "memory now: state pool 29.2 GiB, KV pool 33.2 GiB" in lines
    assert (
        "  ×3.1 `--disable-radix-cache --max-running-requests 69`: 69 running, state pool 50.2 GiB, "
        "KV pool 12.3 GiB (189.3K tokens)"
    ) in lines


def test_analyze_sees_kv_tokens_and_cuda_graphs_bind_before_the_cap():
    long = analyze(server_info(LaunchSettings(mamba_full_memory_ratio=2.5)), prompt_tokens=2000, output_tokens=30000)
    assert (long.cap, long.bound, long.concurrency) == (34, Resource.KV_AT_LENGTHS, 275_550 // 32_004)
    assert "bound by KV tokens at the observed lengths, 8 run at once" in long.explain()
    graphs = analyze(server_info(LaunchSettings(cuda_graph_max_bs=16)), prompt_tokens=600, output_tokens=2000)
    assert (graphs.cap, graphs.bound, graphs.concurrency) == (22, Resource.CUDA_GRAPH, 16)


def runs(settings: LaunchSettings, tokens_per_request: float) -> int:
    """Requests of this length that run at once under `settings`; 0 if the server would not start."""
    try:
        return size_pools(BUDGET, settings).concurrency(tokens_per_request)
    except ValueError:
        return 0


def test_plan_launch_balances_the_pools():
    plan = plan_launch(BUDGET, 2604)
    running = plan.pools.max_running_requests
    assert plan.settings.disable_radix_cache and plan.settings.max_running_requests == running == plan.concurrency
    assert plan.pools.max_total_num_tokens >= running * 2604
    assert runs(replace(plan.settings, max_running_requests=running + 1), 2604) <= running  # no more fit
    # Radix cache on: the ratio that gives the state pool just the slots the KV pool can serve.
    radix = plan_launch(BUDGET, 2604, radix_cache=True)
    assert radix.flags[:2] == ("--mamba-full-memory-ratio", str(radix.settings.mamba_full_memory_ratio))
    assert radix.concurrency == radix.settings.max_running_requests < running
    # At 8K tokens per request the KV pool matters more, and a bf16 state more still.
    long = plan_launch(BUDGET, 8192)
    bf16 = plan_launch(BUDGET, 8192, LaunchSettings(mamba_ssm_dtype="bfloat16"))
    assert long.concurrency < running and bf16.concurrency > long.concurrency
    assert bf16.flags[-2:] == ("--mamba-ssm-dtype", "bfloat16")


def test_the_automatic_memory_fraction_is_0_5_23s():
    # The H200 figure of this module's header: 0.906 × 0.9097 for the default decode graphs (max bs 48).
    assert capacity.auto_mem_fraction_static(143_771 / 1024, 48) == pytest.approx(0.906 * 0.90974, abs=1e-4)
    # Larger decode graphs reserve 2 MiB per batch size; below the 10 GiB floor nothing changes.
    assert capacity.auto_mem_fraction_static(143_771 / 1024, 256) < capacity.auto_mem_fraction_static(140.4, 48)
    # A text-only model is not scaled for a vision encoder.
    text_only = replace(QWEN3_6_27B, vit_layers=0)
    assert capacity.auto_mem_fraction_static(143_771 / 1024, 48, text_only) == 0.906


def test_planning_for_a_gpu_finds_the_cap_where_both_pools_are_used():
    h200 = capacity.GpuMemory(143_771 / 1024, 143_771 / 1024)  # free before start: the CUDA context is 1 GiB
    plan = capacity.plan_for_gpu(h200, 2604)
    assert plan.flags == ("--disable-radix-cache", "--max-running-requests", "69") and plan.concurrency == 69
    assert plan.mem_fraction_static == pytest.approx(0.824, abs=5e-4)
    # The ~116 with a bf16 state, and the radix-cache plan's ratio and cap.
    assert capacity.plan_for_gpu(h200, 2604, LaunchSettings(mamba_ssm_dtype="bfloat16")).cap == 116
    radix = capacity.plan_for_gpu(h200, 2604, radix_cache=True)
    assert radix.flags[0] == "--mamba-full-memory-ratio" and radix.cap == 42
    # The defaults on the same GPU: SGLang's 22 (`gpu_budget_bytes` with the automatic fraction).
    budget, fraction = capacity.gpu_budget_bytes(h200, LaunchSettings())
    assert size_pools(budget, LaunchSettings()).max_running_requests == 22


def test_the_reserved_tokens_and_the_fields_kept_of_server_info():
    info = server_info(LaunchSettings())
    info.update(speculative_num_steps=3, speculative_eagle_topk=1, api_key="x", launch_command="python ...")
    assert capacity.reserved_tokens(info) == 4  # max(1 × 3, 4) (managers/utils.py:484-500)
    assert capacity.reserved_tokens({**info, "speculative_eagle_topk": 2}) == 6  # max(2 × 3, 4)
    assert capacity.reserved_tokens({**info, "speculative_algorithm": None}) == 0
    kept = capacity.capacity_fields(info)
    assert "api_key" not in kept and "launch_command" not in kept
    assert analyze(kept, 600, 2000) == analyze(info, 600, 2000)
    assert "at the expected 2.6K tokens/request" in analyze(kept, 600, 2000).explain("expected")


def test_a_dense_model_has_no_state_pool_to_bind_its_cap():
    # What the real 0.5.23 reports for a dense model on the CPU: no mamba cache, no CUDA graphs, null fields.
    info = {
        "context_length": 4096,
        "max_running_requests": None,
        "max_mamba_cache_size": None,
        "speculative_algorithm": None,
        "max_total_num_tokens": 16384,
        "max_req_input_len": 4090,
        "internal_states": [
            {"effective_max_running_requests_per_dp": 2048, "max_mamba_cache_size": None, "decode_cuda_graph_bs": []}
        ],
    }
    report = analyze(info, prompt_tokens=600, output_tokens=2000)
    assert Resource.MAMBA_SLOTS not in report.limits and report.state_bytes == 0 and report.options == ()
    assert report.cap == 2048 and report.bound is Resource.KV_AT_LENGTHS  # 16384 tokens hold 6 such requests
