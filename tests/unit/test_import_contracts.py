"""The layering of the package (pyproject.toml `[tool.importlinter]`): kept by the tree, and really enforced.

`lint-imports` runs on a copy of the package and pyproject.toml in a temp directory, with PYTHONPATH and the
working directory pointing there, so the copy is what grimp analyses. On the unmodified copy every contract is
kept; with a module in `ingest/` that imports a later stage and one in `store/` that imports Dagster, the two
contracts they break are named and the command fails.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import PROJECT_ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
LAYERS = "Stages import only earlier stages and the ground floor"
NO_DAGSTER = "Only the Dagster layer and the CLI import Dagster"


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=root,
        env={**env, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    """dagster_project and pyproject.toml, copied to tmp_path."""
    shutil.copytree(
        PROJECT_ROOT / "dagster_project", tmp_path / "dagster_project", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copyfile(PROJECT_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_package_keeps_every_contract(package_copy: Path) -> None:
    result = lint_imports(package_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{LAYERS} KEPT" in result.stdout and f"{NO_DAGSTER} KEPT" in result.stdout


def test_a_later_stage_import_and_a_dagster_import_break_their_contracts(package_copy: Path) -> None:
    (package_copy / "dagster_project" / "ingest" / "reaches_ahead.py").write_text(
        "from dagster_project.generation import dispatch  # noqa: F401\n"
    )
    (package_copy / "dagster_project" / "store" / "uses_dagster.py").write_text("import dagster  # noqa: F401\n")
    result = lint_imports(package_copy)
    assert result.returncode != 0
    assert f"{LAYERS} BROKEN" in result.stdout and f"{NO_DAGSTER} BROKEN" in result.stdout, result.stdout
    # The copy was analysed: the report names the modules that only exist there.
    assert "dagster_project.ingest.reaches_ahead" in result.stdout
    assert "dagster_project.store.uses_dagster" in result.stdout


def _imports_within_the_package() -> dict[str, set[str]]:
    """Module → the project's modules it imports anywhere (top level, in functions, under TYPE_CHECKING)."""
    package = PROJECT_ROOT / "dagster_project"
    modules = {}
    for path in package.rglob("*.py"):
        name = ".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def test_no_two_modules_of_one_package_import_each_other() -> None:
    """A circle inside a package (even one only a type annotation closes) means its modules are one responsibility
    split in two, or a type that lives in the wrong one."""
    graph = _imports_within_the_package()

    def room(module: str) -> str:
        return module.rpartition(".")[0]

    def reaches(start: str, goal: str) -> bool:
        seen, stack = {start}, [start]
        while stack:
            for nxt in graph[stack.pop()]:
                if nxt == goal:
                    return True
                if room(nxt) == room(goal) and nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False

    circles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if room(a) == room(b) and reaches(b, a)})
    assert not circles, circles
