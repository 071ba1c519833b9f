"""The real SGLang 0.5.23 on this machine's CPU, for the real-SGLang tier (`make test-sglang`, tests/sglang_real/).

* `sglang_python()` — the python of the separate environment `make sglang-cpu` builds (`SGLANG_PYTHON`, set by
  the Makefile from `SGLANG_VENV`): sglang is never installed in the project's own environment.
* `build_tiny_model(directory)` — a dense `Qwen3ForCausalLM` built here from a config with random weights
  (hidden 64, 2 layers, the Qwen3.6 vocabulary of 248,320 ids: 16 M parameters, 32 MB) and the project's Qwen3.6
  tokenizer saved beside it. Nothing is downloaded. Its answers are noise; its protocol is the real server's.
* `launch_cpu_server(run_dir, model)` — one server through the project's own launch path
  (`launch.launch_fleet` with `ServerOptions(cpu=True)`, as `dflash fleet up --cpu` does), the CPU stand-ins of
  the two `sgl_kernel` ops (`tests/support/sgl_kernel_cpu`) first on its PYTHONPATH.

A server takes 86-190 s to start on 2 cores and ~5.5 GB of memory: a session starts one and shares it.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from dagster_project.sglang import launch

REPO = Path(__file__).resolve().parents[2]
KERNEL_STANDINS = Path(__file__).with_name("sgl_kernel_cpu")
WEIGHTS_SCRIPT = Path(__file__).with_name("tiny_model_weights.py")
# Generous: the tokenizer manager alone took 72-157 s to start on a loaded 2-core machine.
STARTUP_TIMEOUT_S = 900.0
CONTEXT_LENGTH = 4096
MAX_TOTAL_TOKENS = 16384  # without it SGLang sizes the KV pool at ~70% of RAM (12 GB here)

# The tiny model's directory name: the served model the fleet resource expects of it (a path ending in it matches).
TINY_MODEL_NAME = "tiny-qwen3"
# Qwen3.6's vocabulary and special ids (`tokenizer.special_ids`); the layers are as small as SGLang serves.
TINY_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 248320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "attention_bias": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 248044,
    "eos_token_id": 248046,
}
GENERATION_CONFIG = {"bos_token_id": 248044, "eos_token_id": [248046, 248044], "pad_token_id": 248044}

# What every CPU server of the tier is launched with (`dflash fleet up --cpu ...` takes the same).
CPU_OPTIONS = launch.ServerOptions(
    host="127.0.0.1",
    context_length=CONTEXT_LENGTH,
    cpu=True,
    max_total_tokens=MAX_TOTAL_TOKENS,
    speculative="off",
    radix_cache=True,  # SGLang's default: what `cached_tokens` is checked against
)


def sglang_python() -> Path | None:
    """The SGLang environment's python, or None when it is not built (`make sglang-cpu`)."""
    configured = os.environ.get("SGLANG_PYTHON")
    python = Path(configured) if configured else REPO / ".venv-sglang" / "bin" / "python"
    return python if python.is_file() else None


def cpu_server_env() -> dict[str, str]:
    """What a CPU server needs in its environment: the kernel stand-ins first on its import path, nothing from a
    model hub."""
    path = os.pathsep.join(p for p in (str(KERNEL_STANDINS), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def build_tiny_model(directory: Path, python: Path) -> Path:
    """The tiny model in `directory` (made; reused when complete): config, generation config, tokenizer, then
    the random weights written by `python` (the SGLang environment's: torch lives there)."""
    from dagster_project.tokenizer import load_tokenizer

    directory = Path(directory)
    weights = directory / "model.safetensors"
    if weights.is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    load_tokenizer().save_pretrained(str(directory))
    subprocess.run([str(python), str(WEIGHTS_SCRIPT), str(directory)], check=True, timeout=600)
    return directory


def launch_cpu_server(run_dir: Path, model: Path, python: Path, port: int) -> launch.Fleet:
    """One real CPU server on `port`, up (its `/health_generate` answered), recorded in `run_dir`."""
    options = replace(CPU_OPTIONS, model_path=str(model))
    with pytest.MonkeyPatch.context() as patch:  # the server inherits this process's environment
        for name, value in cpu_server_env().items():
            patch.setenv(name, value)
        return launch.launch_fleet(
            [0], run_dir, options, base_port=port, startup_timeout_s=STARTUP_TIMEOUT_S, python=str(python)
        )


# What the fleet resource checks the tiny model's servers against (its name and architecture; Qwen3.6's vocabulary
# and end token are the defaults), from the environment as a job on another model sets it: a resource's run config
# would replace the fleet's other settings (its fleet directory among them).
TINY_MODEL_ENV = {"DFLASH_SERVED_MODEL": TINY_MODEL_NAME, "DFLASH_SERVED_ARCHITECTURE": TINY_CONFIG["architectures"][0]}
