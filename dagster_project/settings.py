"""Project-wide settings, read from the environment once when definitions load.

Secrets never live here: credentials come from the environment through `dg.EnvVar` or the AWS
credential chain. Everything here is plain configuration that is safe to show in the UI.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
DEMO_DATA_DIR = PACKAGE_DIR / "demo_data"

DEFAULT_NUM_SHARDS = 4
DEFAULT_SHARDS_PER_RUN = 64
DEFAULT_FLEET_STALE_AFTER_S = 300.0
DEFAULT_STATUS_BUDGET_S = 10.0


class SettingsError(ValueError):
    """A setting in the environment that cannot be used as it is; the message names the variable."""


def env_str(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise SettingsError(f"{name} must be an integer, got {value!r}") from exc


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name, "").strip()
    return [item.strip() for item in value.split(",") if item.strip()] if value else default


def store_uri() -> str:
    """Root of all pipeline data: a local directory or s3://bucket/prefix."""
    return env_str("DFLASH_STORE", str(Path.cwd() / ".demo" / "store"))


def work_dir() -> Path:
    """Node-local scratch space: journals, staged uploads."""
    return Path(env_str("DFLASH_WORK_DIR", str(Path.cwd() / ".demo" / "work"))).expanduser().resolve()


def num_shards() -> int:
    shards = env_int("DFLASH_NUM_SHARDS", DEFAULT_NUM_SHARDS)
    if shards < 1:
        raise SettingsError(f"DFLASH_NUM_SHARDS must be >= 1, got {shards}")
    return shards


def shards_per_run() -> int:
    """Most shards one run of a backfill covers (`BackfillPolicy.multi_run`); see docs/OPERATIONS.md."""
    shards = env_int("DFLASH_SHARDS_PER_RUN", DEFAULT_SHARDS_PER_RUN)
    if shards < 1:
        raise SettingsError(f"DFLASH_SHARDS_PER_RUN must be >= 1, got {shards}")
    return shards


def prompt_sources() -> list[str]:
    return env_list("DFLASH_SOURCES", [str(DEMO_DATA_DIR)])


def fleet_dir() -> Path:
    """Run directory of `dflash fleet up`: the fleet record (pids, ports, URLs) and one log per server."""
    return Path(env_str("DFLASH_FLEET_DIR", str(work_dir() / "fleet")))


def sglang_endpoints() -> list[str]:
    return env_list("DFLASH_SGLANG_ENDPOINTS", [])


def sglang_router() -> str | None:
    return os.environ.get("DFLASH_SGLANG_ROUTER", "").strip() or None


def cost_per_gpu_hour() -> float | None:
    """US$ per GPU-hour of the fleet, for the cost figures of `status` and the run report; unset: none."""
    value = os.environ.get("DFLASH_COST_PER_GPU_HOUR", "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError as exc:
        raise SettingsError(f"DFLASH_COST_PER_GPU_HOUR must be a number, got {value!r}") from exc


def fleet_stale_after_s() -> float:
    """Seconds after its last `fleet up` a registered node whose servers accept no connection counts as lost."""
    value = os.environ.get("DFLASH_FLEET_STALE_AFTER_S", "").strip()
    try:
        return float(value) if value else DEFAULT_FLEET_STALE_AFTER_S
    except ValueError as exc:
        raise SettingsError(f"DFLASH_FLEET_STALE_AFTER_S must be a number, got {value!r}") from exc


def status_budget_s() -> float:
    """Seconds `dflash status` (and `dflash metrics`) wait for the store's answers; past them it shows its last
    snapshot of the store and says the store is slow. 0: wait as long as the store's retry policy lets a call take."""
    value = os.environ.get("DFLASH_STATUS_BUDGET_S", "").strip()
    try:
        budget = float(value) if value else DEFAULT_STATUS_BUDGET_S
    except ValueError as exc:
        raise SettingsError(f"DFLASH_STATUS_BUDGET_S must be a number of seconds, got {value!r}") from exc
    if budget < 0:
        raise SettingsError(f"DFLASH_STATUS_BUDGET_S must be >= 0, got {value!r}")
    return budget


def tokenizer_name() -> str:
    from dagster_project.tokenizer import BUILTIN_TOKENIZER

    return env_str("DFLASH_TOKENIZER", BUILTIN_TOKENIZER)


def skip_pilot() -> bool:
    """`DFLASH_SKIP_PILOT=1`: the shards generate without a passed pilot of their settings (recorded in each
    completions manifest); read when a run starts."""
    value = os.environ.get("DFLASH_SKIP_PILOT", "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise SettingsError(f"DFLASH_SKIP_PILOT must be 1 or 0, got {value!r}")


def served_model() -> str:
    """The model every SGLang server must serve (its Hub name, or any path ending in it): servers of another are
    set aside before their first request."""
    from dagster_project.sglang.model_identity import QWEN3_6_27B

    return env_str("DFLASH_SERVED_MODEL", QWEN3_6_27B.model)


def served_architecture() -> str:
    """The architecture the served model's `/model_info` must list (a model served under another name may be of
    another architecture too); Qwen3.6-27B's with the built-in tokenizer, else none checked unless given."""
    from dagster_project.sglang.model_identity import QWEN3_6_27B

    return env_str("DFLASH_SERVED_ARCHITECTURE", QWEN3_6_27B.architecture if builtin_model() else "")


def builtin_model() -> bool:
    """Whether the job's model is the built-in Qwen3.6 (no `DFLASH_TOKENIZER`): its served identity is then known
    without reading a tokenizer; another model's vocabulary and end id are read from its tokenizer."""
    from dagster_project.tokenizer import BUILTIN_TOKENIZER

    return tokenizer_name() == BUILTIN_TOKENIZER
