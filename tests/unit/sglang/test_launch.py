"""Fleet command lines without starting anything: sglang 0.5.23 flags, redaction, endpoints, simulator options."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dagster_project.sglang.launch import ServerOptions, connect, redact, server_command

# Every flag `server_command` may emit, each checked to exist in the sglang 0.5.23 wheel
# (sglang/srt/arg_groups/fields/*.py; --reasoning-parser is added in sglang/srt/server_args.py:369).
SGLANG_0_5_23_FLAGS = frozenset(
    (
        "--model-path", "--host", "--port", "--tp-size", "--context-length", "--reasoning-parser",
        "--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
        "--speculative-num-draft-tokens", "--enable-metrics", "--max-running-requests", "--mem-fraction-static",
        "--mamba-full-memory-ratio", "--mamba-ssm-dtype", "--kv-cache-dtype", "--served-model-name",
        "--random-seed", "--api-key", "--disable-radix-cache", "--cuda-graph-max-bs-decode",
        "--mamba-radix-cache-strategy",
    )
)  # fmt: skip
# Gone, deprecated or refused for Qwen3.6 in 0.5.23 (reference TL;DR 7); `--cuda-graph-max-bs` makes argparse exit 2.
REMOVED_FLAGS = (
    "--cuda-graph-max-bs",
    "--mamba-scheduler-strategy",
    "--disable-cuda-graph",
    "--enable-dp-attention",
    "--language-model-only",
)

FULL = ServerOptions(
    max_running_requests=96,
    mem_fraction_static=0.88,
    mamba_full_memory_ratio=2.4,
    mamba_ssm_dtype="bfloat16",
    kv_cache_dtype="fp8_e4m3",
    disable_radix_cache=True,
    served_model_name="qwen",
    api_key="sk-launch-secret",
    extra_args=("--cuda-graph-max-bs-decode", "96", "--mamba-radix-cache-strategy=extra_buffer_lazy"),
)


def flags(command: list[str]) -> list[str]:
    return [arg.split("=")[0] for arg in command if arg.startswith("--")]


def test_server_command_uses_only_sglang_0_5_23_flags_with_mtp_for_qwen3_6():
    command = server_command(FULL, 30001, python="python")
    assert command[:3] == ["python", "-m", "sglang.launch_server"]
    assert set(flags(command)) <= SGLANG_0_5_23_FLAGS
    assert not set(flags(command)) & set(REMOVED_FLAGS)
    text = " ".join(command)
    assert (
        "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 4" in text
    )
    for expected in ("--reasoning-parser qwen3", "--enable-metrics", "--port 30001", "--tp-size 1",
                     "--model-path Qwen/Qwen3.6-27B", "--mamba-full-memory-ratio 2.4", "--max-running-requests 96",
                     "--kv-cache-dtype fp8_e4m3"):  # fmt: skip
        assert expected in text
    assert len(flags(command)) == len(set(flags(command)))


def test_minimal_command_omits_unset_knobs():
    command = server_command(ServerOptions(), 30000)
    assert (
        "--max-running-requests" not in command
        and "--api-key" not in command
        and "--disable-radix-cache" not in command
    )


@pytest.mark.parametrize("flag", REMOVED_FLAGS)
def test_removed_flags_are_refused_before_launch(flag):
    with pytest.raises(ValueError, match=flag):
        server_command(ServerOptions(extra_args=(flag, "1")), 30000)


def test_the_api_key_is_redacted_from_recorded_commands():
    recorded = redact(server_command(FULL, 30000))
    assert "sk-launch-secret" not in recorded and "--api-key" in recorded
    assert "sk-launch-secret" not in repr(FULL)


@pytest.mark.integration  # a subprocess of the GPU node's python
@pytest.mark.skipif(
    not os.environ.get("SGLANG_PYTHON"), reason="set SGLANG_PYTHON to a python with sglang 0.5.23 (GPU nodes)"
)
def test_real_sglang_parses_the_command():
    python = os.environ["SGLANG_PYTHON"]
    command = server_command(FULL, 30000, python=python)
    check = "from sglang.srt.server_args import prepare_server_args; import sys; prepare_server_args(sys.argv[1:])"
    subprocess.run([python, "-c", check, *command[3:]], check=True, timeout=300)


def test_connect_normalizes_endpoints_or_one_router():
    assert connect("h1:30000, http://h2:30001/") == ["http://h1:30000", "http://h2:30001"]
    assert connect(["https://gpu-7.example:8000"]) == ["https://gpu-7.example:8000"]
    assert connect(router_url="router:30000") == ["http://router:30000"]
    for bad in ({}, {"endpoints": "a:1,a:1"}, {"endpoints": " , "}, {"endpoints": "a:1", "router_url": "b:1"}):
        with pytest.raises(ValueError):
            connect(**bad)


def test_every_simulator_option_survives_the_command_line():
    from dataclasses import fields

    from dagster_project.sglang.launch import simulator_command
    from dagster_project.sglang.sim.server import SimConfig, parse_args

    options = {
        "model_path": "m", "served_model_name": "served", "tokenizer": "tok", "api_key": "k", "enable_metrics": True,
        "speculative": False, "spec_draft_tokens": 3, "reasoning_parser": "qwen3", "context_length": 1000,
        "token_capacity": 5000, "max_running_requests": 9, "effective_max_running_requests": 7,
        "gpu_memory_gb": 100.5, "weights_gb": 50.0, "mem_fraction_static": 0.85, "mamba_full_memory_ratio": 2.5,
        "max_mamba_cache_size": 300, "disable_radix_cache": True, "mamba_radix_cache_strategy": "extra_buffer_lazy",
        "mamba_ssm_dtype": "bfloat16", "kv_cache_dtype": "fp8_e4m3", "cuda_graph_max_bs_decode": 32,
        "max_queued_requests": 2, "seed": 5, "output_len": "uniform:1:9", "max_output_len": 99,
        "answer_fraction": (0.2, 0.4), "accept_probs": (0.5, 0.25, 0.25), "accept_decay_tokens": 4096,
        "accept_decay_batch": 32, "ttft_s": 0.5, "prefill_s_per_token": 0.001, "decode_step_s": 0.02,
        "decode_step_growth": 0.01, "startup_s": 1.5, "health_latency_s": 0.1, "health_check_timeout_s": 3.0,
        "request_log_limit": 10, "faults": {"hang": True, "error_503": 2},
    }  # fmt: skip
    assert set(options) | {"host", "port", "vocab_file"} == {f.name for f in fields(SimConfig)}
    command = simulator_command(4321, options, vocab_file=Path("/v.json"), host="127.0.0.1")
    assert parse_args(command[3:]) == SimConfig(host="127.0.0.1", port=4321, vocab_file="/v.json", **options)
