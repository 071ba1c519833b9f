"""SGLang 0.5.23: the native protocol, a client with typed errors, fleet launch, and a CPU simulator.

Plain logic, no dagster. The protocol facts were checked against the sglang 0.5.23 wheel.
"""

from dagster_project.sglang.client import GenerateResult, SGLangClient, SGLangError
from dagster_project.sglang.protocol import check_generate_response, sampling_params

__all__ = ["GenerateResult", "SGLangClient", "SGLangError", "check_generate_response", "sampling_params"]
