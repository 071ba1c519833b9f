"""One root URI for all pipeline data: a local directory (demo, tests) or `s3://bucket/prefix` (production).

Both backends expose the same small API over keys relative to the root. Writes are whole objects:
a local write goes to a temporary file renamed into place, an S3 write is a single PUT (or a completed
multipart upload), so a reader never sees half an object. Every upload is verified (size and sha256)
before the call returns.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol

SHA256_METADATA_KEY = "sha256"
_CHUNK = 1 << 20
# Requests one reader or writer keeps in flight on S3: enough to hide the round trips, few enough for a small
# machine (and within `bounded_client`'s connection pool).
S3_WORKERS = 16


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str | None = None
    modified: float | None = None
    # S3's ETag (the same in a listing and a HEAD): tells a rewritten object from the one published without
    # reading it. None for a local store, whose checksum is computed from the file instead.
    etag: str | None = None


class StoreError(RuntimeError):
    """An object could not be written, read or verified."""


class StoreLocationError(StoreError, ValueError):
    """The store's root cannot be a store: a malformed URI, or a local path that is, or lies under, a file."""


class CorruptObject(StoreError):
    """An object is in the store but cannot be read as what it should be (truncated, overwritten, not JSON)."""


class PreconditionFailed(StoreError):
    """A conditional write lost: the object was not in the state the writer expected."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long one store operation may take: every S3 call goes through it.

    A call that hangs is cut by the socket timeouts; a transient failure is retried with exponential backoff
    until `attempts` or `deadline_s` runs out; a permanent one (access denied, no such bucket, bad
    credentials) fails at once. botocore's own retries are off so that this is the only policy.
    """

    attempts: int = field(default=5, metadata={"help": "Tries per S3 call before the run fails."})
    backoff_s: float = field(default=0.5, metadata={"help": "First retry delay; doubles on each retry."})
    connect_timeout_s: float = field(default=5.0, metadata={"help": "Seconds to open a connection."})
    read_timeout_s: float = field(
        default=30.0, metadata={"help": "Per socket read, not per object: a large upload is not cut short."}
    )
    deadline_s: float = field(default=60.0, metadata={"help": "No new attempt starts after this long."})
    publish_deadline_s: float = field(
        default=900.0,
        metadata={
            "help": "A shard's publish (its objects, manifest and index) fails, naming the store, when it is still "
            "calling S3 this long after it began; 0: no deadline."
        },
    )

    def __post_init__(self) -> None:
        bounds = (self.backoff_s, self.connect_timeout_s, self.read_timeout_s, self.deadline_s, self.publish_deadline_s)
        if self.attempts < 1 or min(bounds) < 0:
            raise ValueError(f"invalid store retry policy {self}")


@dataclass
class StoreCalls:
    """The calls a store made and those it had to retry, by cause (an S3 error code such as `SlowDown`, or the
    transport error's type): throttling and a slow endpoint lose nothing, but the operator sees them."""

    made: int = 0
    retried: Counter[str] = field(default_factory=Counter)

    @property
    def retried_share(self) -> float:
        return sum(self.retried.values()) / self.made if self.made else 0.0


class Store(Protocol):
    uri: str
    calls: StoreCalls

    # `synced=False`: the object is not made durable on its own (on a local disk, no fsync of its own); `sync()`
    # then makes every object written so far durable at once, before the writer publishes what points at them.
    def put_bytes(self, key: str, data: bytes, *, synced: bool = True) -> ObjectInfo: ...
    def put_file(self, key: str, path: Path, *, synced: bool = True) -> ObjectInfo: ...
    def sync(self) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def download(self, key: str, path: Path) -> Path: ...
    def exists(self, key: str) -> bool: ...
    def head(self, key: str) -> ObjectInfo | None: ...
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]: ...
    def delete(self, key: str) -> None: ...
    def url(self, key: str) -> str: ...
    # No store call starts past the policy's `publish_deadline_s` from entering (`StoreError` naming `what`).
    def deadline(self, what: str) -> AbstractContextManager[None]: ...

    # Compare-and-swap on one small object (leases): `version` is an opaque tag of the object's content.
    def get_versioned(self, key: str) -> tuple[bytes, str] | None: ...
    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        """Write only if the object is at `version` (None: only if it does not exist); the new version."""
        ...


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _load_syncfs() -> Callable[[int], int] | None:
    """syncfs(2) from the C library (Linux); None where it has none."""
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


_syncfs = _load_syncfs()


@cache
def _file_mode() -> int:
    """The mode a plain `open()` would give a new file under this process's umask (temporary files get 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def _written_in_place(path: Path, synced: bool = True) -> Iterator[Any]:
    """A temporary file beside `path` to write the object into; renamed to `path` once written (and synced,
    unless `synced` is False: the caller makes it durable later, `LocalStore.sync`).

    A write that fails (a full disk, no permission, a file size limit) removes the temporary file and raises
    `StoreError` naming `path` and the cause: nothing is left behind, and the operator knows where to look.
    """
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
            tmp_name = tmp.name
            yield tmp
            tmp.flush()
            if synced:
                os.fsync(tmp.fileno())
        os.chmod(tmp_name, _file_mode())
        os.replace(tmp_name, path)
        tmp_name = None
    except OSError as exc:
        raise StoreError(f"writing {path} failed: {exc}") from exc
    finally:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)


class LocalStore:
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)
        self.calls = StoreCalls()  # a local disk is never retried
        # Refused here, once, rather than as a NotADirectoryError from the first read or write deep in a stage.
        existing = next(path for path in (self.root, *self.root.parents) if path.exists())
        if not existing.is_dir():
            raise StoreLocationError(
                f"the store root {self.uri} is not a directory: {existing} is a file (set DFLASH_STORE to a "
                "directory, or to s3://bucket/prefix)"
            )

    def deadline(self, what: str) -> AbstractContextManager[None]:
        return nullcontext()  # a local disk that is slow is not waited on call by call

    def _path(self, key: str) -> Path:
        # normpath, not resolve(): no file system calls for a key (readers of 1,830 shards ask for many).
        path = os.path.normpath(os.path.join(self.root, key))
        if path != self.uri and not path.startswith(self.uri + os.sep):
            raise StoreError(f"key escapes the store root: {key!r}")
        return Path(path)

    def put_bytes(self, key: str, data: bytes, *, synced: bool = True) -> ObjectInfo:
        path = self._path(key)
        with _written_in_place(path, synced) as tmp:
            tmp.write(data)
        return ObjectInfo(key, len(data), sha256_bytes(data), path.stat().st_mtime)

    def put_file(self, key: str, path: Path, *, synced: bool = True) -> ObjectInfo:
        target = self._path(key)
        digest = hashlib.sha256()  # hashed while written: the object is not read back
        with _written_in_place(target, synced) as tmp, open(path, "rb") as source:
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
                tmp.write(chunk)
        stat = target.stat()
        return ObjectInfo(key, stat.st_size, digest.hexdigest(), stat.st_mtime)

    def move_in(self, key: str, path: Path, *, synced: bool = True) -> ObjectInfo | None:
        """The local file at `path` renamed to be the object `key` (hashed first): no copy, and no second file to
        create and later delete. None, and the file left where it is, when it lies on another file system."""
        target = self._path(key)
        digest = sha256_file(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(path, _file_mode())
            if synced:
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
            os.replace(path, target)
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                return None
            raise StoreError(f"writing {target} failed: {exc}") from exc
        stat = target.stat()
        return ObjectInfo(key, stat.st_size, digest, stat.st_mtime)

    def sync(self) -> None:
        """Every object written so far durable, with the renames that named them: one syncfs(2) of the store's
        file system (one journal commit, not one per object), or where the C library lacks it, sync(2)."""
        try:
            fd = os.open(self.root, os.O_RDONLY)
        except OSError as exc:
            raise StoreError(f"syncing {self.uri} failed: {exc}") from exc
        try:
            if _syncfs is None or _syncfs(fd) != 0:
                os.sync()
        finally:
            os.close(fd)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise StoreError(f"no object {self.url(key)}") from exc

    def download(self, key: str, path: Path) -> Path:
        source = self._path(key)
        if not source.exists():
            raise StoreError(f"no object {self.url(key)}")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)
        return path

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        if not path.is_file():
            return None
        stat = path.stat()
        return ObjectInfo(key, stat.st_size, sha256_file(path), stat.st_mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = self._path(prefix) if prefix else self.root
        # "fleet/" names a directory: when it is absent nothing matches (its parent may be the whole store).
        search_root = base if base.is_dir() or prefix.endswith("/") else base.parent
        if not search_root.exists():
            return
        start = os.path.relpath(search_root, self.root).replace(os.sep, "/")
        # Keys are built as the walk descends (a store of 1,830 shards has ~3,700 directories: a path computation
        # per directory or file was most of a listing's time). Like os.walk: symlinked directories are not entered.
        found, pending = [], [("" if start == "." else f"{start}/", str(search_root))]
        while pending:
            relative, directory = pending.pop()
            with os.scandir(directory) as entries:
                for entry in entries:
                    key = relative + entry.name
                    if entry.is_dir():
                        if not entry.is_symlink() and (key.startswith(prefix) or prefix.startswith(key + "/")):
                            pending.append((key + "/", entry.path))
                    elif not entry.name.startswith(".") and key.startswith(prefix):
                        stat = entry.stat()
                        found.append(ObjectInfo(key, stat.st_size, None, stat.st_mtime))
        yield from sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def url(self, key: str) -> str:
        return str(self.root / key)

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return data, sha256_bytes(data)

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Every writer of this key on this file system serializes on the lock file: compare, then swap.
        with open(path.parent / f".{path.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self.get_versioned(key)
            if (current[1] if current else None) != version:
                raise PreconditionFailed(f"{self.url(key)} changed since it was read (expected version {version})")
            return self.put_bytes(key, data).sha256 or sha256_bytes(data)


class S3Store:
    """Objects under `s3://bucket/prefix`, through a boto3 client (see `bounded_client`)."""

    def __init__(
        self,
        uri: str,
        client: Any,
        policy: RetryPolicy = RetryPolicy(),
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        """`clock` and `sleep` time the retries' backoff and deadlines (a test's virtual clock stands in for them)."""
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.client = client
        self.policy = policy
        self.calls = StoreCalls()
        self._clock, self._sleep = clock, sleep
        self._answered_s: float | None = None  # how long the last S3 call that answered took
        self._waiting: dict[object, float] = {}  # the calls in flight: token → when it began (`clock`)
        self._deadline: tuple[float, str] | None = None  # (`clock` time, what it bounds), while one holds

    @property
    def last_call_s(self) -> float | None:
        """How long the store's last call took, for a deadline's message and `dflash status`: a call still waiting
        counts its wait so far (a store too slow to answer within a budget shows how slow), else the last answer's."""
        now = self._clock()
        return max((now - begun for begun in list(self._waiting.values())), default=self._answered_s)

    @contextmanager
    def _timed(self) -> Iterator[None]:
        token, begun = object(), self._clock()
        self._waiting[token] = begun
        try:
            yield
        finally:
            del self._waiting[token]
            self._answered_s = self._clock() - begun

    @contextmanager
    def deadline(self, what: str) -> Iterator[None]:
        if not self.policy.publish_deadline_s:
            yield
            return
        self._deadline = (self._clock() + self.policy.publish_deadline_s, what)
        try:
            yield
        finally:
            self._deadline = None

    def _check_deadline(self, action: str, key: str) -> None:
        if self._deadline is not None and self._clock() > self._deadline[0]:
            last_s = self.last_call_s
            last = f"{last_s:.1f} s" if last_s is not None else "unknown"
            raise StoreError(
                f"{self._deadline[1]} passed its deadline of {self.policy.publish_deadline_s:.0f} s (the store "
                f"resource's publish_deadline_s) before {action} {self.url(key)}: the store {self.uri} is slow "
                f"(its last call took {last}); nothing more is sent, and a rerun publishes from the journal"
            )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _relative(self, full_key: str) -> str:
        return full_key[len(self.prefix) + 1 :] if self.prefix else full_key

    def _retrying(self, action: str, key: str, call: Callable[[], Any]) -> Any:
        """Transient S3 failures (throttling, a restarting or hung endpoint) are retried with exponential
        backoff, within the policy's attempts and deadline; permanent ones fail at once."""
        policy, started = self.policy, self._clock()
        for attempt in range(1, policy.attempts + 1):
            self._check_deadline(action, key)
            self.calls.made += 1
            try:
                with self._timed():
                    result = call()
            except Exception as exc:  # botocore raises many unrelated types for transport errors
                delay = policy.backoff_s * 2 ** (attempt - 1)
                elapsed = self._clock() - started
                if not _is_transient(exc):
                    raise StoreError(f"{action} {self.url(key)} failed: {exc} (not retried: permanent)") from exc
                if attempt == policy.attempts or elapsed + delay > policy.deadline_s:
                    raise StoreError(
                        f"{action} {self.url(key)} failed after {attempt} attempt(s) in {elapsed:.0f} s: {exc}"
                    ) from exc
                self.calls.retried[_error_code(exc) or type(exc).__name__] += 1
                self._sleep(delay)
            else:
                return result
        raise AssertionError("unreachable")

    def _verify(self, key: str, size: int, sha256: str) -> ObjectInfo:
        info = self.head(key)
        if info is None or info.size != size or info.sha256 != sha256:
            raise StoreError(
                f"upload of {self.url(key)} did not verify: expected {size} bytes sha256 {sha256[:12]}, "
                f"store has {info.size if info else 'nothing'} bytes sha256 {(info.sha256 or '')[:12] if info else ''}"
            )
        return info

    # An object is durable once its PUT returns: `synced` changes nothing here, and `sync` has nothing to do.
    def sync(self) -> None:
        pass

    def put_bytes(self, key: str, data: bytes, *, synced: bool = True) -> ObjectInfo:
        digest = sha256_bytes(data)
        self._retrying(
            "PUT",
            key,
            lambda: self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, Metadata={SHA256_METADATA_KEY: digest}
            ),
        )
        return self._verify(key, len(data), digest)

    def put_file(self, key: str, path: Path, *, synced: bool = True) -> ObjectInfo:
        digest, size = sha256_file(path), path.stat().st_size
        self._retrying(
            "upload",
            key,
            lambda: self.client.upload_file(
                str(path), self.bucket, self._key(key), ExtraArgs={"Metadata": {SHA256_METADATA_KEY: digest}}
            ),
        )
        return self._verify(key, size, digest)

    def get_bytes(self, key: str) -> bytes:
        response = self._retrying("GET", key, lambda: self.client.get_object(Bucket=self.bucket, Key=self._key(key)))
        return response["Body"].read()

    def download(self, key: str, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._retrying("download", key, lambda: self.client.download_file(self.bucket, self._key(key), str(path)))
        return path

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            response = self._retrying(
                "HEAD", key, lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            )
        except StoreError as exc:
            if _is_not_found(exc.__cause__):
                return None
            raise
        return ObjectInfo(
            key,
            int(response["ContentLength"]),
            response.get("Metadata", {}).get(SHA256_METADATA_KEY),
            response["LastModified"].timestamp() if response.get("LastModified") else None,
            response.get("ETag"),
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        page_args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        while True:
            page = self._retrying("LIST", prefix, lambda: self.client.list_objects_v2(**page_args))
            for item in page.get("Contents", []):
                yield ObjectInfo(
                    self._relative(item["Key"]),
                    int(item["Size"]),
                    None,
                    item["LastModified"].timestamp(),
                    item.get("ETag"),
                )
            if not page.get("IsTruncated"):
                return
            page_args["ContinuationToken"] = page["NextContinuationToken"]

    def delete(self, key: str) -> None:
        self._retrying("DELETE", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key)))

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        try:
            response = self._retrying(
                "GET", key, lambda: self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            )
        except StoreError as exc:
            if _is_not_found(exc.__cause__):
                return None
            raise
        return response["Body"].read(), response["ETag"]

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        condition = {"IfMatch": version} if version is not None else {"IfNoneMatch": "*"}
        try:
            response = self._retrying(
                "conditional PUT",
                key,
                lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition),
            )
        except StoreError as exc:
            if _error_code(exc.__cause__) in _CONFLICT:
                raise PreconditionFailed(f"{self.url(key)} changed since it was read (expected {version})") from exc
            raise
        return response["ETag"]

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"


_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
# A conditional write that lost the race (412), or raced another conditional write of the same key (409).
_CONFLICT = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}
# Retrying these cannot help: the operator has to fix credentials, permissions or the bucket name.
_PERMANENT = {
    "400",
    "403",
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "InvalidBucketName",
    "NoSuchBucket",
    "SignatureDoesNotMatch",
    "ExpiredToken",
}
_CODE_IN_MESSAGE = re.compile(r"An error occurred \((\w+)\)")


def _error_code(exc: BaseException | None) -> str:
    """The S3 error code of a botocore error, also when boto3's transfer layer wrapped it in another type."""
    while exc is not None:
        code = str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))
        if code:
            return code
        found = _CODE_IN_MESSAGE.search(str(exc))
        if found:
            return found.group(1)
        exc = exc.__cause__ or exc.__context__
    return ""


def _is_not_found(exc: BaseException | None) -> bool:
    return _error_code(exc) in _NOT_FOUND


def _is_transient(exc: BaseException) -> bool:
    from botocore.exceptions import NoCredentialsError, PartialCredentialsError

    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return False
    code = _error_code(exc)
    return code not in _NOT_FOUND and code not in _PERMANENT and code not in _CONFLICT


_S3_URI = re.compile(r"s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`; anything else that names the s3 scheme is refused."""
    match = _S3_URI.fullmatch(uri.strip())
    if match is None:
        raise StoreLocationError(
            f"{uri!r} is not a valid S3 URI: write s3://bucket/prefix (two slashes, a lowercase bucket)"
        )
    return match["bucket"], (match["prefix"] or "").strip("/")


def bounded_client(policy: RetryPolicy, **client_args: Any) -> Any:
    """A boto3 S3 client whose calls cannot hang: connect and read timeouts, no hidden botocore retries.

    `client_args` are boto3's (`region_name`, `endpoint_url`, `use_ssl`, `verify`, and `profile_name` for
    the session); credentials come from boto3's own chain (environment, profile, instance role).
    """
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(profile_name=client_args.pop("profile_name", None))
    config = Config(
        connect_timeout=policy.connect_timeout_s,
        read_timeout=policy.read_timeout_s,
        retries={"total_max_attempts": 1},
        # Readers run up to 16 requests at once (index blocks, manifests, downloads); past the pool's size
        # (botocore's default is 10) each extra request would open a connection and drop it after.
        max_pool_connections=32,
    )
    return session.client("s3", config=config, **client_args)


def open_store(
    uri: str, s3_client_factory: Callable[[], Any] | None = None, policy: RetryPolicy = RetryPolicy()
) -> Store:
    """A store for `uri`: a local path, or `s3://bucket/prefix` (which needs a client factory)."""
    if uri.strip().lower().startswith("s3:"):
        parse_s3_uri(uri)
        if s3_client_factory is None:
            raise ValueError(f"{uri} is an S3 URI but no S3 client was given")
        return S3Store(uri, s3_client_factory(), policy)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", uri):
        raise StoreLocationError(f"unsupported store URI {uri!r}: use a local path or s3://bucket/prefix")
    # A URI that lost its colon (`s3//bucket/x`) is a valid relative path: taken as one, the data would go to a
    # local directory `./s3/bucket/x` that nobody else reads.
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*//", uri.strip()):
        scheme = uri.strip().split("/", 1)[0]
        raise StoreLocationError(
            f"store URI {uri!r} looks like a URI missing the colon after {scheme!r} (write {scheme}://...); "
            "a local directory is a plain path (./name, or an absolute one)"
        )
    return LocalStore(uri)
