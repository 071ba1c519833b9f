from __future__ import annotations

import dagster as dg
from dagster_aws.s3 import S3Resource

from dagster_project.storage import Store, open_store


class DatasetStore(dg.ConfigurableResource):
    """The pipeline's root URI (DESIGN §3): a local directory, or s3://bucket/prefix through `s3`."""

    root: str
    s3: S3Resource

    def open(self) -> Store:
        return open_store(self.root, self.s3.get_client)
