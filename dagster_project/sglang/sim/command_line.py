"""The simulator's command line: SGLang 0.5.23's flags that the simulator models, its own (faults, latency model,
outputs), and SGLang's `--config FILE`, parsed into a `SimConfig`. A launch SGLang would refuse (a speculative
setting, a memory that does not fit) fails here, as the real server fails to start."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson
import yaml

from dagster_project.sglang import capacity
from dagster_project.sglang.sim.config import SimConfig
from dagster_project.sglang.sim.outputs import parse_length_distribution


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def parse_args(argv: Sequence[str] | None = None) -> SimConfig:
    defaults = SimConfig()
    parser = argparse.ArgumentParser(
        prog="python -m dagster_project.sglang.sim.server",
        description="An SGLang 0.5.23 stand-in: one HTTP server process that answers like the real one.",
    )
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument("--model-path", default=defaults.model_path)
    parser.add_argument("--served-model-name")
    parser.add_argument("--model-type", default=defaults.model_type, help="/model_info's model_type")
    parser.add_argument("--architecture", default=defaults.architecture, help="/model_info's architectures[0]")
    parser.add_argument(
        "--vocab-size", type=int, default=defaults.vocab_size, help="the served vocabulary (input ids are checked)"
    )
    parser.add_argument(
        "--tokenizer", help="tokenizer name or path (default: the project's built-in Qwen3.6 tokenizer)"
    )
    parser.add_argument(
        "--vocab-file", help="vocabulary sketch written by the fleet launcher (skips loading the tokenizer)"
    )
    parser.add_argument("--api-key")
    parser.add_argument("--config", help="YAML file of options (CLI > file > defaults), as SGLang's --config")
    parser.add_argument("--enable-metrics", action="store_true")
    parser.add_argument(
        "--no-speculative", dest="speculative", action="store_false", help="serve as if launched without MTP"
    )
    parser.add_argument(
        "--spec-draft-tokens", "--speculative-num-draft-tokens", type=int, default=defaults.spec_draft_tokens
    )
    parser.add_argument(
        "--speculative-num-steps", type=int, help="default: draft tokens − 1 (a chain); sets them under top-k 1"
    )
    parser.add_argument("--speculative-eagle-topk", type=int, default=defaults.speculative_eagle_topk)
    parser.add_argument(
        "--reasoning-parser",
        type=lambda name: name or None,
        default=defaults.reasoning_parser,
        help="empty: none (a model whose chat template does not reason)",
    )
    parser.add_argument("--context-length", type=int, default=defaults.context_length)
    parser.add_argument("--token-capacity", type=int, default=defaults.token_capacity)
    parser.add_argument("--max-running-requests", type=int, help="default: 48 with speculative decoding")
    parser.add_argument(
        "--effective-max-running-requests",
        type=int,
        help="without --gpu-memory-gb: the real cap (e.g. set by the mamba pool); default: --max-running-requests",
    )
    memory = parser.add_argument_group(
        "memory model", "size the KV pool, the mamba state pool and the cap from GPU memory as SGLang 0.5.23 does"
    )
    memory.add_argument("--gpu-memory-gb", type=float, help="GiB free before the weights load: turns the model on")
    memory.add_argument("--weights-gb", type=float, default=defaults.weights_gb)
    memory.add_argument("--mem-fraction-static", type=float, default=defaults.mem_fraction_static)
    memory.add_argument("--mamba-full-memory-ratio", type=float, default=defaults.mamba_full_memory_ratio)
    memory.add_argument("--max-mamba-cache-size", type=int)
    memory.add_argument("--disable-radix-cache", action="store_true")
    memory.add_argument(
        "--mamba-radix-cache-strategy", choices=capacity.RADIX_STRATEGIES, default=defaults.mamba_radix_cache_strategy
    )
    memory.add_argument("--mamba-ssm-dtype", choices=("float32", "bfloat16", "float16"))
    memory.add_argument(
        "--kv-cache-dtype", choices=("auto", "bfloat16", "fp8_e4m3", "fp8_e5m2"), default=defaults.kv_cache_dtype
    )
    memory.add_argument("--cuda-graph-max-bs-decode", type=int)
    parser.add_argument("--max-queued-requests", type=int)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--output-len", default=defaults.output_len, help="fixed:N | uniform:A:B | lognormal:MEDIAN:SIGMA"
    )
    parser.add_argument("--max-output-len", type=int, default=defaults.max_output_len)
    parser.add_argument(
        "--answer-fraction",
        type=_floats,
        default=defaults.answer_fraction,
        help="LOW,HIGH share of the output after </think>",
    )
    parser.add_argument(
        "--tool-call-share",
        type=float,
        default=defaults.tool_call_share,
        help="share of answers to prompts that declare tools written as a <tool_call>",
    )
    parser.add_argument(
        "--malformed-tool-call-share",
        type=float,
        default=defaults.malformed_tool_call_share,
        help="share of those tool calls written malformed on purpose",
    )
    parser.add_argument(
        "--accept-probs",
        type=_floats,
        default=defaults.accept_probs,
        help="P(k drafts accepted) per verify pass, k=0..N, measured at a chain of N steps (other settings keep its "
        "per-draft acceptance)",
    )
    parser.add_argument("--accept-decay-tokens", type=int, default=defaults.accept_decay_tokens)
    parser.add_argument("--ttft-s", type=float, default=defaults.ttft_s)
    parser.add_argument("--prefill-s-per-token", type=float, default=defaults.prefill_s_per_token)
    parser.add_argument(
        "--decode-step-s",
        type=float,
        default=defaults.decode_step_s,
        help="at batch size one under MTP 3/1/4 (other speculative settings and none are priced from it)",
    )
    parser.add_argument(
        "--decode-step-growth",
        type=float,
        default=defaults.decode_step_growth,
        help="a decode step takes (1 + GROWTH × (batch − 1)) × --decode-step-s",
    )
    parser.add_argument(
        "--accept-decay-batch",
        type=int,
        default=defaults.accept_decay_batch,
        help="batch size beyond one at which draft acceptance has fallen halfway to none; 0: no decay",
    )
    parser.add_argument("--startup-s", type=float, default=defaults.startup_s)
    parser.add_argument("--health-latency-s", type=float, default=defaults.health_latency_s)
    parser.add_argument("--health-check-timeout-s", type=float, default=defaults.health_check_timeout_s)
    parser.add_argument("--request-log-limit", type=int, default=defaults.request_log_limit)
    parser.add_argument(
        "--faults", type=orjson.loads, default={}, help="initial faults as JSON, e.g. '{\"hang\": true}'"
    )
    args = parser.parse_args(_merge_config_file(list(sys.argv[1:] if argv is None else argv), parser))
    del args.config
    config = SimConfig(**vars(args))
    try:  # a speculative setting SGLang would refuse fails here, as the real server refuses to start
        _ = config.draft_accept_probs
    except ValueError as exc:
        parser.error(str(exc))
    parse_length_distribution(config.output_len)  # a bad spec fails here, before the slow vocabulary load
    for name in ("tool_call_share", "malformed_tool_call_share"):
        if not 0 <= getattr(config, name) <= 1:
            parser.error(f"--{name.replace('_', '-')} is a share: between 0 and 1, got {getattr(config, name)}")
    try:  # a launch that would not fit the memory fails here, as the real server fails to start
        _ = config.pools
    except ValueError as exc:
        parser.error(str(exc))
    return config


def _merge_config_file(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """SGLang 0.5.23's `--config FILE` (its `ConfigArgumentMerger`): each `key: value` of the YAML mapping becomes
    `--key value` (`--key` alone for a true switch) ahead of the command line's own flags, which win."""
    if "--config" not in argv:
        return argv
    at = argv.index("--config")
    if at == len(argv) - 1:
        parser.error("--config needs a YAML file")
    path = Path(argv[at + 1])
    if path.suffix.lower() not in (".yaml", ".yml") or not path.is_file():
        parser.error(f"--config {path}: not a YAML file that exists")
    options = yaml.safe_load(path.read_text()) or {}
    if not isinstance(options, dict):
        parser.error(f"--config {path}: the file must hold a mapping of options")
    switches = {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    merged: list[str] = []
    for key, value in options.items():
        if key.replace("-", "_") in switches:
            merged += [f"--{key}"] if value else []
        else:
            merged += [f"--{key}", str(value)]
    return merged + argv[:at] + argv[at + 2 :]
