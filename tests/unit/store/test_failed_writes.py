"""A local write that fails part way (a full disk, no permission) leaves no temporary file beside the object and
raises `StoreError` naming the object's path.

The failures are real ones from the kernel, in a child process: a file size limit (`RLIMIT_FSIZE`) makes a
write fail part way exactly as a full disk does (EFBIG instead of ENOSPC, from the same `write` call), and a
child that drops root for `nobody` meets EACCES from a directory it may not write (root itself would not).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

NOBODY = 65534

# Runs in the child: `limit` applies before the store is touched; prints the StoreError's message.
_CHILD = textwrap.dedent(
    """
    import os, resource, signal, sys
    from pathlib import Path
    from dagster_project.store.storage import LocalStore, StoreError

    root, method, limit, uid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    source = Path(root).parent / "source.bin"
    if method == "put_file":
        source.write_bytes(b"x" * 200_000)
    if limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the child
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    if uid:
        os.setresuid(uid, uid, uid)
    store = LocalStore(root)
    try:
        if method == "put_file":
            store.put_file("shard=00001/part.parquet", source)
        else:
            store.put_bytes("shard=00001/part.parquet", b"y" * 200_000)
    except StoreError as exc:
        print(exc)
        sys.exit(3)
    """
)


def _put_in_child(root: Path, method: str, *, file_size_limit: int = 0, uid: int = 0) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), method, str(file_size_limit), str(uid)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
        timeout=60,
    )
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)
    return done.stdout.strip()


@pytest.mark.parametrize("method", ["put_bytes", "put_file"])
def test_a_write_cut_short_leaves_no_temporary_file_and_names_the_path(tmp_path, method):
    root = tmp_path / "store"
    (root / "shard=00001").mkdir(parents=True)
    message = _put_in_child(root, method, file_size_limit=64_000)
    target = root / "shard=00001" / "part.parquet"
    assert message.startswith(f"writing {target} failed: [Errno 27] File too large"), message
    assert list((root / "shard=00001").iterdir()) == []  # neither the object nor a temporary file


@pytest.mark.parametrize("method", ["put_bytes", "put_file"])
def test_a_directory_the_writer_may_not_write_is_named(method):
    # Under /tmp, not pytest's tmp_path (0700 above it): the child that drops root must reach the store.
    with tempfile.TemporaryDirectory() as base:
        root = Path(base) / "store"
        directory = root / "shard=00001"
        directory.mkdir(parents=True)
        for path in (Path(base), root):
            path.chmod(0o755)
        directory.chmod(0o555)  # nobody may write it; root is never refused, so a root test's child is `nobody`
        message = _put_in_child(root, method, uid=NOBODY if os.geteuid() == 0 else 0)
        target = directory / "part.parquet"
        assert message.startswith(f"writing {target} failed: [Errno 13] Permission denied"), message
        assert list(directory.iterdir()) == []
