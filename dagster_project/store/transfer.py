"""Moving a store's objects to and from local files, and calling the store for many objects at once: a local
store's files are used in place; S3's are downloaded or uploaded, with calls side by side."""

from __future__ import annotations

import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from dagster_project.store.storage import S3_WORKERS, LocalStore, ObjectInfo, S3Store, Store, StoreError

T = TypeVar("T")
R = TypeVar("R")


def local_files(store: Store, keys: list[str], directory: Path, workers: int = 16) -> list[Path]:
    """Local files with the objects' bytes, in `keys` order: the objects themselves for a local store; for S3,
    concurrent downloads into `directory` (the caller removes them)."""
    if isinstance(store, LocalStore):
        return [store._path(key) for key in keys]
    targets = [directory / f"{number:06d}-{Path(key).name}" for number, key in enumerate(keys)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(store.download, keys, targets))


def put_file_moving(store: Store, key: str, path: Path, *, synced: bool = True) -> ObjectInfo:
    """`store.put_file`, giving the local file up: on a local store on the file system of `path` the file is renamed
    into place (`LocalStore.move_in`); elsewhere it is uploaded, then removed."""
    moved = store.move_in(key, path, synced=synced) if isinstance(store, LocalStore) else None
    if moved is not None:
        return moved
    uploaded = store.put_file(key, path, synced=synced)
    path.unlink()
    return uploaded


def map_in_order(
    store: Store, function: Callable[[T], R], items: Iterable[T], workers: int = S3_WORKERS
) -> Iterator[R]:
    """`map(function, items)`, in order; on S3 with up to `workers` calls in flight (each one or a few round trips,
    which threads hide; a boto3 client is thread-safe) and no more than `workers` results made ahead of the
    consumer, so memory stays bounded by `workers` results. A local store's calls run in turn (no round trip to
    hide). The first call that raises raises here, in its turn; calls not started yet are cancelled."""
    if isinstance(store, LocalStore):
        yield from map(function, items)
        return
    pending: deque[Future[R]] = deque()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            for item in items:
                pending.append(pool.submit(function, item))
                if len(pending) >= workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def arrow_filesystem(store: Store) -> tuple[Any, str]:
    """(pyarrow file system, root path in it) over the store, for readers that fetch only parts of objects
    (Parquet footers and column chunks, by ranged GETs on S3). On S3 it signs with the credentials the store's
    boto3 client resolved (environment, profile or role), which are handed over and never shown."""
    from pyarrow import fs

    if isinstance(store, LocalStore):
        return fs.LocalFileSystem(), str(store.root)
    assert isinstance(store, S3Store)
    # botocore exposes the credentials it resolved only through its request signer.
    credentials = store.client._request_signer._credentials
    frozen = credentials.get_frozen_credentials() if credentials is not None else None
    endpoint = urlsplit(store.client.meta.endpoint_url)
    filesystem = fs.S3FileSystem(
        access_key=frozen.access_key if frozen else None,
        secret_key=frozen.secret_key if frozen else None,
        session_token=frozen.token if frozen else None,
        region=store.client.meta.region_name,
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme,
        connect_timeout=store.policy.connect_timeout_s,
        request_timeout=store.policy.read_timeout_s,
    )
    return filesystem, f"{store.bucket}/{store.prefix}".rstrip("/")


@contextmanager
def local_copy(store: Store, key: str) -> Iterator[Path]:
    """A local file with the object's bytes: the object itself for a local store, a temporary download for S3."""
    if isinstance(store, LocalStore):
        path = store._path(key)
        if not path.is_file():
            raise StoreError(f"no object {store.url(key)}")
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="dflash-") as tmp:
        yield store.download(key, Path(tmp) / Path(key).name)
