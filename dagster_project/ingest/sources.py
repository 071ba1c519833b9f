"""Source specs → the prompt files they name, local or on S3.

A source spec is `URI`, `NAME=URI` or `NAME@FORMAT[:FIELD]=URI`. The URI is a local file, a directory
(every supported file under it), a glob (`data/**/*.parquet`), or the same on S3 (`s3://bucket/prefix/`,
`s3://bucket/dir/*.jsonl`). Every row records its source name, so counts per source are visible: NAME when
given, else the file's name without its extensions (`dummy_conversation.json` → `dummy_conversation`). Name
the source when one dataset spans many files (`nemotron_chat=s3://bucket/nemotron/chat/`). A local path
with `=` before its first `/` must be written `./...` or absolute, so that it is not read as a name.

`@FORMAT` sets the row format of this source's files (`sharegpt`, `openai`, `alpaca`, `prompt`, `text`, and the
public layouts `hh_rlhf`, `oasst`, `ultrachat`),
where detection guesses wrong or cannot tell; `:FIELD` names the source's own column for the format's main
field (the messages, the instruction or the prompt), e.g. `c4@prompt:text=data/c4.jsonl` generates from a
plain-text corpus by reading its `text` column as the prompt. Without `@`, each file's format is detected
from its first rows (or set for the whole run by the ingest's `format` config).

Files that are not data — `dataset_info.json` and the other metadata files of Hugging Face and
LLaMA-Factory dataset folders, READMEs — are skipped with a notice (`SourceFile.skip`), never read as rows.

S3 files are downloaded to the work directory (Parquet needs random access) and deleted after reading, so local
disk holds the few files being read at most. A download's name carries a digest of its bucket and key, not only
the object's base name: a Hugging Face dataset keeps `train.jsonl` in several folders, and those copies, read side
by side, must never overwrite each other.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dagster_project.ingest.formats import FORMATS
from dagster_project.ingest.readers import COMPRESSIONS, is_supported

_NAMED_SPEC = re.compile(r"^([A-Za-z0-9_.-]*)(?:@([A-Za-z][A-Za-z_]*)(?::([^=/]+))?)?=(.+)$")
_GLOB_CHARS = re.compile(r"[*?\[]")
# Metadata that dataset folders keep beside their data (Hugging Face `datasets`, LLaMA-Factory).
_NOT_DATA_NAMES = frozenset(
    {"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json", "dataset_info.jsonl"}
)


class SourceError(ValueError):
    """A source spec that names no readable file."""


@dataclass(frozen=True)
class SourceSpec:
    name: str | None
    uri: str
    format: str | None = None  # None: detected per file
    field: str | None = None  # the source's name for the format's main field


@dataclass(frozen=True)
class SourceFile:
    source: str
    uri: str  # absolute local path or s3://bucket/key
    format: str | None = None
    field: str | None = None
    skip: str | None = None  # why the file is not read as data (metadata, a README)


def parse_spec(spec: str) -> SourceSpec:
    """The parts of a source spec (`URI`, `NAME=URI`, `NAME@FORMAT[:FIELD]=URI`)."""
    match = _NAMED_SPEC.match(spec.strip())
    if not match or not (match.group(1) or match.group(2)):
        return SourceSpec(None, spec.strip())
    name, fmt, field_name, uri = match.groups()
    if fmt is not None and fmt not in FORMATS:
        raise SourceError(f"source {spec!r}: unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return SourceSpec(name or None, uri, fmt, field_name.strip() if field_name else None)


def default_source_name(uri: str) -> str:
    name = Path(urlparse(uri).path).name
    if Path(name).suffix.lower() in COMPRESSIONS:
        name = Path(name).stem
    return Path(name).stem


def not_data(uri: str) -> str | None:
    """Why the file at `uri` is not a data file, or None when it is one."""
    name = Path(urlparse(uri).path).name.lower()
    if name in _NOT_DATA_NAMES:
        return f"{name} is dataset metadata, not rows"
    if name.startswith("readme"):
        return "a README, not rows"
    return None


def resolve_sources(specs: list[str], s3_client: Callable[[], Any] | None = None) -> list[SourceFile]:
    """The files of every spec, in spec order and sorted within a spec; raises SourceError if one matches nothing.

    Metadata files come back too, marked `skip`, so the ingest can say what it left out."""
    if not specs:
        raise SourceError("no prompt sources given")
    files = []
    for spec in specs:
        parsed = parse_spec(spec)
        uris = _s3_files(parsed.uri, s3_client) if parsed.uri.startswith("s3://") else _local_files(parsed.uri)
        if not uris:
            raise SourceError(f"source {spec!r} matched no .json/.jsonl/.parquet file")
        files.extend(
            SourceFile(
                parsed.name or default_source_name(found), found, parsed.format, parsed.field, skip=not_data(found)
            )
            for found in uris
        )
    return files


def _local_files(uri: str) -> list[str]:
    path = Path(uri).expanduser()
    if _GLOB_CHARS.search(uri):
        candidates = [Path(p) for p in glob.glob(str(path), recursive=True)]
    elif path.is_dir():
        candidates = [p for p in path.rglob("*") if not any(part.startswith(".") for part in p.relative_to(path).parts)]
    elif path.is_file():
        if not is_supported(path.name):
            raise SourceError(f"{uri}: unsupported file type (expected .json, .jsonl, .ndjson, .parquet, + .gz/.zst)")
        candidates = [path]
    else:
        raise SourceError(f"{uri}: no such file or directory")
    # Absolute, as the user named it: a symlinked data folder keeps the name the user knows it by.
    return sorted(os.path.abspath(p) for p in candidates if p.is_file() and is_supported(p.name))


def _s3_files(uri: str, s3_client: Callable[[], Any] | None) -> list[str]:
    if s3_client is None:
        raise SourceError(f"{uri} is on S3 but no S3 client was given")
    parsed = urlparse(uri)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    pattern = key if _GLOB_CHARS.search(key) else None
    prefix = key[: _GLOB_CHARS.search(key).start()] if pattern else key
    keys = []
    for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    if pattern:
        matched = [k for k in keys if fnmatch.fnmatchcase(k, pattern)]
    elif key in keys:
        matched = [key]
    else:
        directory = key.rstrip("/") + "/" if key else ""
        matched = [k for k in keys if k.startswith(directory)]
    return [f"s3://{bucket}/{k}" for k in sorted(matched) if is_supported(k)]


def _download_name(uri: str) -> str:
    """The local name of the S3 object at `uri`: unique to its bucket and key, ending in its own name (readable)."""
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return f"{digest}-{Path(urlparse(uri).path).name}"


@contextmanager
def local_copy(file: SourceFile, work_dir: Path, s3_client: Callable[[], Any] | None = None) -> Iterator[Path]:
    """A local path for the file: itself, or a download under `work_dir` removed afterwards."""
    if not file.uri.startswith("s3://"):
        yield Path(file.uri)
        return
    if s3_client is None:
        raise SourceError(f"{file.uri} is on S3 but no S3 client was given")
    parsed = urlparse(file.uri)
    target = work_dir / "source_downloads" / _download_name(file.uri)
    target.parent.mkdir(parents=True, exist_ok=True)
    s3_client().download_file(parsed.netloc, parsed.path.lstrip("/"), str(target))
    try:
        yield target
    finally:
        target.unlink(missing_ok=True)
