"""The README's recipe for one real server on the CPU is the real-SGLang tier's, runnable as written: its
commands exist with these flags, the model it builds is the tier's, and `fleet up --cpu` itself puts the kernel
stand-ins first on the server's import path (nothing under tests/ is needed)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from dagster_project.cli import build_parser
from dagster_project.sglang import launch, tiny_model
from tests.support import sglang_real
from tests.support.paths import PROJECT_ROOT


def _recipe() -> list[list[str]]:
    readme = (PROJECT_ROOT / "README.md").read_text()
    block = readme.split("**One real server on the CPU**", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", "").splitlines() if line.strip()]


def test_the_readme_recipe_builds_the_tiers_model_and_starts_its_server():
    make, build, fleet_up, served = _recipe()
    assert make == ["make", "sglang-cpu"]
    assert re.search(r"^sglang-cpu: \$\(SGLANG_VENV\)/.installed$", (PROJECT_ROOT / "Makefile").read_text(), re.M)
    assert "SGLANG_VENV ?= $(CURDIR)/.venv-sglang" in (PROJECT_ROOT / "Makefile").read_text()
    python = ".venv-sglang/bin/python"
    assert build == [
        ".venv/bin/python",
        "-m",
        "dagster_project.sglang.tiny_model",
        "/tmp/tiny-qwen3",
        "--python",
        python,
    ]
    assert build[3].endswith(sglang_real.TINY_MODEL_NAME)

    # `fleet up --cpu` as dflash parses it: the tier's server (sglang_real.CPU_OPTIONS) on the tier's model.
    env = dict(word.split("=", 1) for word in fleet_up if "=" in word and not word.startswith("-"))
    argv = [word for word in fleet_up if word not in {f"{k}={v}" for k, v in env.items()}]
    assert env == sglang_real.cpu_server_env() and argv[:3] == [".venv/bin/dflash", "fleet", "up"]
    args = build_parser("fleet").parse_args(argv[1:])
    given = {name: getattr(args, name) for name in ("cpu", "model_path", "python", "speculative", "context_length",
                                                    "max_total_tokens")}  # fmt: skip
    assert given == {
        "cpu": True,
        "model_path": build[3],
        "python": python,
        "speculative": sglang_real.CPU_OPTIONS.speculative,
        "context_length": sglang_real.CPU_OPTIONS.context_length,
        "max_total_tokens": sglang_real.CPU_OPTIONS.max_total_tokens,
    }
    launch.ServerOptions(**{name: value for name, value in given.items() if name != "python"})  # accepted
    assert served[0] == "export" and dict(word.split("=", 1) for word in served[1:]) == tiny_model.TINY_MODEL_ENV


def test_a_cpu_server_imports_the_kernel_stand_ins_before_any_installed_sgl_kernel():
    environment = launch.cpu_server_environment()
    assert environment["SGLANG_USE_CPU_ENGINE"] == "1"
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.util; print(importlib.util.find_spec('sgl_kernel').origin)"],
        env={**launch.server_environment(), **environment},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert found == str(launch.CPU_KERNELS / "sgl_kernel" / "__init__.py")
