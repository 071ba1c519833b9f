from pathlib import Path

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field

from dagster_project.resources.config_fields import config_fields
from dagster_project.store.storage import RetryPolicy, Store, StoreLocationError, bounded_client, open_store


class DatasetStore(config_fields(RetryPolicy, dg.ConfigurableResource)):
    """The pipeline's root URI: a local directory, or s3://bucket/prefix reached with `s3`'s settings and the
    retry policy of this resource's config; and this node's work directory, where journals and files on their
    way into the store are kept."""

    root: str = Field(description="Root of all data: a local directory or s3://bucket/prefix.")
    work_dir: str = Field(description="Node-local scratch space: journals, staged uploads (never shared).")
    s3: S3Resource

    def open(self) -> Store:
        policy = self.to_dataclass()

        def s3_client():
            return bounded_client(
                policy,
                region_name=self.s3.region_name,
                endpoint_url=self.s3.endpoint_url,
                use_ssl=self.s3.use_ssl,
                verify=self.s3.verify,
                profile_name=self.s3.profile_name,
            )

        try:
            return open_store(self.root, s3_client, policy)
        except StoreLocationError as exc:  # a setting to fix, not a bug: the step fails saying which, not how
            raise dg.Failure(description=f"the store resource's root (DFLASH_STORE): {exc}") from None

    def local_dir(self) -> Path:
        """The work directory, created."""
        path = Path(self.work_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
