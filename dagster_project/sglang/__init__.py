"""SGLang 0.5.23: the native protocol, a client with typed errors, fleet launch, and a CPU simulator.

Plain logic, no dagster. The protocol facts were checked against the sglang 0.5.23 wheel.
"""

from typing import Any

__all__ = ["GenerateResult", "SGLangClient", "SGLangError", "check_generate_response", "sampling_params"]


def __getattr__(name: str) -> Any:
    """The package's names, imported on first use: the client imports aiohttp, which readers of the protocol or
    the capacity model alone (`dflash status` without a fleet) do without."""
    if name in {"GenerateResult", "SGLangClient", "SGLangError"}:
        from dagster_project.sglang import client

        return getattr(client, name)
    if name in {"check_generate_response", "sampling_params"}:
        from dagster_project.sglang import protocol

        return getattr(protocol, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
