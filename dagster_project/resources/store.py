import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field

from dagster_project.store.storage import S3Store, Store, open_store


class DatasetStore(dg.ConfigurableResource):
    """The pipeline's root URI (DESIGN §3): a local directory, or s3://bucket/prefix through `s3`."""

    root: str
    s3: S3Resource
    attempts: int = Field(default=5, description="Tries per S3 call before the run fails loudly.")
    retry_backoff_s: float = Field(default=0.5, description="First retry delay; doubles on each retry.")

    def open(self) -> Store:
        store = open_store(self.root, self.s3.get_client)
        if isinstance(store, S3Store):
            store.attempts, store.backoff_s = self.attempts, self.retry_backoff_s
        return store
