from pathlib import Path

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field

from dagster_project.store.storage import RetryPolicy, Store, bounded_client, open_store

DEFAULT_POLICY = RetryPolicy()


class DatasetStore(dg.ConfigurableResource):
    """The pipeline's root URI: a local directory, or s3://bucket/prefix reached with `s3`'s settings; and this
    node's work directory, where journals and files on their way into the store are kept."""

    root: str
    work_dir: str = Field(description="Node-local scratch space: journals, staged uploads (never shared).")
    s3: S3Resource
    attempts: int = Field(default=DEFAULT_POLICY.attempts, description="Tries per S3 call before the run fails.")
    retry_backoff_s: float = Field(default=DEFAULT_POLICY.backoff_s, description="First retry delay; doubles.")
    connect_timeout_s: float = DEFAULT_POLICY.connect_timeout_s
    read_timeout_s: float = Field(default=DEFAULT_POLICY.read_timeout_s, description="Per socket read.")
    deadline_s: float = Field(default=DEFAULT_POLICY.deadline_s, description="No S3 retry starts after this long.")

    def open(self) -> Store:
        policy = RetryPolicy(
            attempts=self.attempts,
            backoff_s=self.retry_backoff_s,
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            deadline_s=self.deadline_s,
        )

        def s3_client():
            return bounded_client(
                policy,
                region_name=self.s3.region_name,
                endpoint_url=self.s3.endpoint_url,
                use_ssl=self.s3.use_ssl,
                verify=self.s3.verify,
                profile_name=self.s3.profile_name,
            )

        return open_store(self.root, s3_client, policy)

    def local_dir(self) -> Path:
        """The work directory, created."""
        path = Path(self.work_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
