"""The real SGLang 0.5.23 on this machine's CPU, for the real-SGLang tier (`make test-sglang`, tests/sglang_real/).

* `sglang_python()` — the python of the separate environment `make sglang-cpu` builds (`SGLANG_PYTHON`, set by
  the Makefile from `SGLANG_VENV`): sglang is never installed in the project's own environment.
* `build_tiny_model(directory)` — the tiny Qwen3 model a user builds the same way
  (`python -m dagster_project.sglang.tiny_model`, `sglang/tiny_model.py`).
* `launch_cpu_server(run_dir, model)` — one server through the project's own launch path
  (`launch.launch_fleet` with `ServerOptions(cpu=True)`, as `dflash fleet up --cpu` does: the CPU stand-ins of
  the two `sgl_kernel` ops first on its PYTHONPATH).

A server takes 86-190 s to start on 2 cores and ~5.5 GB of memory: a session starts one and shares it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from dagster_project.sglang import launch
from dagster_project.sglang.tiny_model import (  # noqa: F401 (the tier names them from here)
    TINY_CONFIG,
    TINY_MODEL_ENV,
    TINY_MODEL_NAME,
    build_tiny_model,
)

REPO = Path(__file__).resolve().parents[2]
# Generous: the tokenizer manager alone took 72-157 s to start on a loaded 2-core machine.
STARTUP_TIMEOUT_S = 900.0
CONTEXT_LENGTH = 4096
MAX_TOTAL_TOKENS = 16384  # without it SGLang sizes the KV pool at ~70% of RAM (12 GB here)

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
    """What a CPU server of the tier adds to its environment: nothing from a model hub (`fleet up --cpu` puts the
    kernel stand-ins on its PYTHONPATH itself)."""
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def launch_cpu_server(run_dir: Path, model: Path, python: Path, port: int) -> launch.Fleet:
    """One real CPU server on `port`, up (its `/health_generate` answered), recorded in `run_dir`."""
    options = replace(CPU_OPTIONS, model_path=str(model))
    with pytest.MonkeyPatch.context() as patch:  # the server inherits this process's environment
        for name, value in cpu_server_env().items():
            patch.setenv(name, value)
        return launch.launch_fleet(
            [0], run_dir, options, base_port=port, startup_timeout_s=STARTUP_TIMEOUT_S, python=str(python)
        )
