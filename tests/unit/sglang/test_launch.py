"""Fleet command lines without starting anything: sglang 0.5.23 flags, the API key kept off them, endpoints,
simulator options."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from dagster_project.sglang import capacity, launch
from dagster_project.sglang.launch import FleetError, ServerOptions, connect, server_command, write_secrets_config
from dagster_project.sglang.launch_plan import (
    CapacityTarget,
    describe_plan,
    fleet_gpu,
    parse_nvidia_smi,
    plan_capacity,
    plan_simulators,
)

# Every flag `server_command` may emit, each checked to exist in the sglang 0.5.23 wheel
# (sglang/srt/arg_groups/fields/*.py; --reasoning-parser is added in sglang/srt/server_args.py:369;
# --max-mamba-cache-size at fields/schedule.py:216, --load-format at fields/model.py:58).
SGLANG_0_5_23_FLAGS = frozenset(
    (
        "--model-path", "--host", "--port", "--tp-size", "--context-length", "--reasoning-parser",
        "--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
        "--speculative-num-draft-tokens", "--enable-metrics", "--max-running-requests", "--mem-fraction-static",
        "--mamba-full-memory-ratio", "--mamba-ssm-dtype", "--kv-cache-dtype", "--served-model-name",
        "--random-seed", "--config", "--disable-radix-cache", "--cuda-graph-max-bs-decode",
        "--mamba-radix-cache-strategy", "--max-mamba-cache-size", "--load-format",
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
    max_mamba_cache_size=200,
    mamba_ssm_dtype="bfloat16",
    kv_cache_dtype="fp8_e4m3",
    radix_cache=True,
    load_format="dummy",
    served_model_name="qwen",
    api_key="sk-launch-secret",
    extra_args=("--cuda-graph-max-bs-decode", "96", "--mamba-radix-cache-strategy=extra_buffer_lazy"),
)


def flags(command: list[str]) -> list[str]:
    return [arg.split("=")[0] for arg in command if arg.startswith("--")]


def test_server_command_uses_only_sglang_0_5_23_flags_with_mtp_for_qwen3_6():
    command = server_command(FULL, 30001, python="python", config_file="/run/gpu0.secrets.yaml")
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
                     "--kv-cache-dtype fp8_e4m3", "--max-mamba-cache-size 200", "--load-format dummy"):  # fmt: skip
        assert expected in text
    assert "--disable-radix-cache" not in command  # radix_cache=True keeps SGLang's default
    assert len(flags(command)) == len(set(flags(command)))


def test_minimal_command_omits_unset_knobs_and_turns_the_radix_cache_off():
    command = server_command(ServerOptions(), 30000)
    assert "--max-running-requests" not in command and "--api-key" not in command and "--load-format" not in command
    # Unique prompts gain nothing from prefix reuse, and the radix cache costs 5 state slots per request.
    assert "--disable-radix-cache" in command


@pytest.mark.parametrize("flag", REMOVED_FLAGS)
def test_removed_flags_are_refused_before_launch(flag):
    with pytest.raises(ValueError, match=flag):
        server_command(ServerOptions(extra_args=(flag, "1")), 30000)


def test_the_api_key_goes_in_a_config_file_only_its_user_reads_never_on_the_command_line(tmp_path):
    secrets = write_secrets_config(tmp_path / "gpu0.secrets.yaml", "sk-launch-secret")
    command = server_command(FULL, 30000, config_file=str(secrets))
    assert not any("sk-launch-secret" in arg for arg in command) and "--api-key" not in command
    assert command[command.index("--config") + 1] == str(secrets)
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    # SGLang 0.5.23 reads `--config` with yaml.safe_load and turns `api-key: K` into `--api-key K`
    assert yaml.safe_load(secrets.read_text()) == {"api-key": "sk-launch-secret"}
    assert "sk-launch-secret" not in repr(FULL)
    with pytest.raises(ValueError, match="never on the command line"):
        server_command(FULL, 30000)
    with pytest.raises(ValueError, match="never on the command line"):
        server_command(ServerOptions(extra_args=("--api-key=k",)), 30000)


@pytest.mark.integration  # a subprocess of the GPU node's python
@pytest.mark.gpu_only
@pytest.mark.skipif(
    not os.environ.get("SGLANG_PYTHON"), reason="set SGLANG_PYTHON to a python with sglang 0.5.23 (GPU nodes)"
)
def test_real_sglang_parses_the_command():
    python = os.environ["SGLANG_PYTHON"]
    # A local model directory where the node has one (gpu_check.sh's random-weights one): GPU nodes are often offline.
    options = replace(FULL, model_path=os.environ.get("SGLANG_TEST_MODEL") or FULL.model_path)
    command = server_command(options, 30000, python=python)
    check = "from sglang.srt.server_args import prepare_server_args; import sys; prepare_server_args(sys.argv[1:])"
    subprocess.run([python, "-c", check, *command[3:]], check=True, timeout=300)


def test_connect_normalizes_endpoints_or_one_router():
    assert connect("h1:30000, http://h2:30001/") == ["http://h1:30000", "http://h2:30001"]
    assert connect(["https://gpu-7.example:8000"]) == ["https://gpu-7.example:8000"]
    assert connect(router_url="router:30000") == ["http://router:30000"]
    for bad in ({}, {"endpoints": "a:1,a:1"}, {"endpoints": " , "}, {"endpoints": "a:1", "router_url": "b:1"}):
        with pytest.raises(ValueError):
            connect(**bad)


def test_every_simulator_option_survives_the_command_line(tmp_path):
    from dataclasses import fields

    from dagster_project.sglang.launch import simulator_command
    from dagster_project.sglang.sim.command_line import SimConfig, parse_args

    options = {
        "model_path": "m", "served_model_name": "served", "model_type": "llama", "architecture": "LlamaForCausalLM",
        "vocab_size": 128256, "tokenizer": "tok", "enable_metrics": True,
        "speculative": False, "spec_draft_tokens": 3, "speculative_num_steps": 2, "speculative_eagle_topk": 2,
        "reasoning_parser": "qwen3", "context_length": 1000,
        "token_capacity": 5000, "max_running_requests": 9, "effective_max_running_requests": 7,
        "gpu_memory_gb": 100.5, "weights_gb": 50.0, "mem_fraction_static": 0.85, "mamba_full_memory_ratio": 2.5,
        "max_mamba_cache_size": 300, "disable_radix_cache": True, "mamba_radix_cache_strategy": "extra_buffer_lazy",
        "mamba_ssm_dtype": "bfloat16", "kv_cache_dtype": "fp8_e4m3", "cuda_graph_max_bs_decode": 32,
        "max_queued_requests": 2, "seed": 5, "output_len": "uniform:1:9", "max_output_len": 99,
        "answer_fraction": (0.2, 0.4), "tool_call_share": 0.3, "malformed_tool_call_share": 0.1,
        "accept_probs": (0.5, 0.25, 0.25), "accept_decay_tokens": 4096,
        "accept_decay_batch": 32, "ttft_s": 0.5, "prefill_s_per_token": 0.001, "decode_step_s": 0.02,
        "decode_step_growth": 0.01, "startup_s": 1.5, "health_latency_s": 0.1, "health_check_timeout_s": 3.0,
        "request_log_limit": 10, "faults": {"hang": True, "error_503": 2},
    }  # fmt: skip
    assert set(options) | {"host", "port", "vocab_file", "api_key"} == {f.name for f in fields(SimConfig)}
    secrets = str(write_secrets_config(tmp_path / "sim0.secrets.yaml", "k"))  # the key as a real server gets it
    command = simulator_command(4321, options, vocab_file=Path("/v.json"), host="127.0.0.1", config_file=secrets)
    assert not any("k" == arg for arg in command)
    expected = SimConfig(host="127.0.0.1", port=4321, vocab_file="/v.json", api_key="k", **options)
    assert parse_args(command[3:]) == expected
    with pytest.raises(ValueError, match="never on the command line"):
        simulator_command(4321, {"api_key": "k"}, vocab_file=None, host="127.0.0.1")


# ---- launching at the ceiling -----------------------------------------------------------------------------------

# nvidia-smi on one H200 (143,771 MiB) and a busier second GPU, as `--format=csv,noheader,nounits` prints them.
NVIDIA_SMI = "0, 143771, 143771\n1, 143771, 120000\n"
H200 = capacity.GpuMemory(143771 / 1024, 143771 / 1024)


def test_nvidia_smi_output_gives_each_gpus_memory():
    memory = parse_nvidia_smi(NVIDIA_SMI + "garbage\n")
    assert set(memory) == {0, 1} and memory[1].free_gib == pytest.approx(120000 / 1024)
    assert memory[0].free_before_load_gib == pytest.approx(143771 / 1024 - capacity.CUDA_CONTEXT_GIB)


def test_a_launch_left_to_the_plan_runs_at_the_ceiling():
    options, plan = plan_capacity(ServerOptions(), CapacityTarget(), H200)
    # 600 + 2,000 tokens per request (+4 drafts): the state pool and the KV pool balance at 68 requests on an
    # H200 (69 without the plan's 2% margin: tests/unit/sglang/test_capacity.py).
    assert options.max_running_requests == plan.cap == plan.concurrency == 68
    assert plan.flags == ("--disable-radix-cache", "--max-running-requests", "68")
    assert "--disable-radix-cache" in server_command(options, 30000)
    assert plan.mem_fraction_static == pytest.approx(0.824, abs=5e-4)  # SGLang's own, for this cap
    # A bf16 state halves the slots' memory: more requests fit (a numerics change, so never the default).
    bf16, _ = plan_capacity(ServerOptions(mamba_ssm_dtype="bfloat16"), CapacityTarget(), H200)
    assert bf16.max_running_requests > 100
    # Longer requests need more KV per request: fewer run at once.
    long, _ = plan_capacity(ServerOptions(), CapacityTarget(expected_output_tokens=8000), H200)
    assert long.max_running_requests == 47
    # Keeping the radix cache: the plan sets the state pool's share and the cap that fits.
    radix, radix_plan = plan_capacity(ServerOptions(radix_cache=True), CapacityTarget(), H200)
    assert radix.mamba_full_memory_ratio is not None and radix.max_running_requests == radix_plan.cap < 68


def test_servers_sized_by_hand_are_launched_as_asked_with_the_cap_they_will_compute():
    defaults = ServerOptions(radix_cache=True, max_running_requests=48)  # SGLang's own sizing
    options, plan = plan_capacity(defaults, CapacityTarget(), H200)
    assert options == defaults and plan is not None and plan.cap == 22 and plan.flags == ()
    assert plan_capacity(defaults, CapacityTarget(), None) == (defaults, None)
    with pytest.raises(FleetError, match="would not start"):
        plan_capacity(ServerOptions(max_running_requests=200), CapacityTarget(), H200)


def test_a_plan_needs_the_gpus_memory():
    with pytest.raises(FleetError, match="--gpu-memory-gib"):
        plan_capacity(ServerOptions(), CapacityTarget(), None)
    # The operator's figure stands in for nvidia-smi (the total then is the figure plus a CUDA context).
    gpu = fleet_gpu([0], CapacityTarget(gpu_memory_gib=139.4))
    assert gpu is not None and gpu.free_gib == 139.4


def test_simulators_with_a_memory_model_are_planned_like_gpus():
    h200 = {"gpu_memory_gb": 139.4, "mem_fraction_static": 0.824, "output_len": "fixed:8"}
    options, plan = plan_simulators(h200, CapacityTarget())
    assert options["disable_radix_cache"] and options["max_running_requests"] == plan.cap == 69
    assert "cap 69 per server with `--disable-radix-cache --max-running-requests 69`" in describe_plan(plan)
    given, expected = plan_simulators({**h200, "max_running_requests": 48}, CapacityTarget())
    assert given["max_running_requests"] == 48 and "disable_radix_cache" not in given and expected.cap == 22
    assert plan_simulators({"output_len": "fixed:8"}, CapacityTarget()) == ({"output_len": "fixed:8"}, None)
    assert describe_plan(None).startswith("plan: none")


def test_a_cpu_server_is_launched_on_the_torch_native_path_with_its_kv_pool_fixed():
    options = ServerOptions(model_path="/models/tiny", cpu=True, speculative="off", max_total_tokens=16384)
    command = server_command(options, 31000, python="py")
    at = command.index("--device")
    assert command[at : at + 4] == ["--device", "cpu", "--attention-backend", "torch_native"]
    assert command[command.index("--max-total-tokens") + 1] == "16384"
    assert "--speculative-algorithm" not in command


@pytest.mark.parametrize(
    ("options", "refusal"),
    [({"max_total_tokens": 16384}, "speculative decoding does not run on the CPU"), ({"speculative": "off"}, "needs")],
)
def test_a_cpu_server_refuses_speculative_decoding_and_needs_a_kv_pool_size(options, refusal):
    with pytest.raises(ValueError, match=refusal):
        ServerOptions(cpu=True, **options)


def test_a_port_is_busy_while_something_listens_on_it_not_while_closed_connections_linger():
    from dagster_project.sglang.launch import _port_free

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert not _port_free("127.0.0.1", port)
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its end lingers in TIME_WAIT, as a killed server's do
        client.close()
    assert _port_free("127.0.0.1", port)  # a server restarted on its port binds it (SO_REUSEADDR)


def test_a_server_listens_on_this_host_only_unless_asked_and_wider_without_a_key_is_warned():
    command = server_command(ServerOptions(), 30000)
    assert command[command.index("--host") + 1] == launch.LOOPBACK == "127.0.0.1"
    assert launch.exposure_warning("127.0.0.1", None) is None and launch.exposure_warning("127.0.0.2", None) is None
    assert launch.exposure_warning("localhost", None) is None and launch.exposure_warning("::1", None) is None
    warning = launch.exposure_warning("0.0.0.0", None)
    assert warning is not None and warning.startswith("WARNING: the servers listen on 0.0.0.0 (beyond this host)")
    assert "WITHOUT an API key" in warning and "SGLANG_API_KEY" in warning
    assert launch.exposure_warning("0.0.0.0", "sk-x") is None and launch.exposure_warning("gpu-node-1", "sk-x") is None
    assert launch.exposure_warning("10.0.0.5", None) is not None
