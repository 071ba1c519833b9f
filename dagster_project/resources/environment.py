"""The pipeline's resources, configured from the environment once: the definitions run with them, and
`dflash` reads the store and reaches the fleet through the same objects."""

import os

import dagster as dg
from dagster_aws.s3 import S3Resource

from dagster_project import settings
from dagster_project.resources.eval_sets import EvalSets
from dagster_project.resources.fleet import SGLangFleet
from dagster_project.resources.generation import GenerationConfig
from dagster_project.resources.store import DatasetStore
from dagster_project.resources.tokenizer import TokenizerResource


def store_from_env(s3: S3Resource | None = None) -> DatasetStore:
    """The `store` resource as the environment configures it (`DFLASH_STORE`, `DFLASH_WORK_DIR`)."""
    return DatasetStore(root=settings.store_uri(), work_dir=str(settings.work_dir()), s3=s3 or S3Resource())


def resources_from_env(*, resolve_secrets: bool = False) -> dict[str, dg.ConfigurableResource]:
    """`resolve_secrets`: for a process that uses the resources without Dagster initializing them (`dflash`), the
    secrets' values rather than references that Dagster resolves when it initializes them."""
    # Credentials, endpoint, region and profile reach boto3 through its own environment chain
    # (AWS_ACCESS_KEY_ID, AWS_PROFILE, AWS_ENDPOINT_URL, ...): nothing secret is set here.
    s3 = S3Resource()
    return {
        "s3": s3,
        "store": store_from_env(s3),
        "tokenizer": TokenizerResource(name_or_path=settings.tokenizer_name()),
        "generation": GenerationConfig(),
        "eval_sets": EvalSets(eval_files=settings.env_list("DFLASH_EVAL_SETS", [])),
        "fleet": SGLangFleet(
            endpoints=settings.sglang_endpoints(),
            router_url=settings.sglang_router(),
            fleet_dir=str(settings.fleet_dir()),
            cost_per_gpu_hour=settings.cost_per_gpu_hour(),
            stale_node_after_s=settings.fleet_stale_after_s(),
            served_model=settings.served_model(),
            served_architecture=settings.served_architecture(),
            # Another model's vocabulary and end id are its tokenizer's, read when a run first checks a server.
            **({} if settings.builtin_model() else {"served_vocab_size": 0, "served_eos_token_id": -1}),
            # An EnvVar is resolved when the resource is initialized: the key never enters run config or the UI.
            api_key=(os.environ.get("SGLANG_API_KEY") if resolve_secrets else dg.EnvVar("SGLANG_API_KEY"))
            if os.environ.get("SGLANG_API_KEY")
            else None,
        ),
    }
