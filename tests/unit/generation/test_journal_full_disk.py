"""A journal whose disk fills up: the error names the journal and the free space left, and every answer written
before it survives (a rerun resumes from them).

The failure is a real one from the kernel, in a child process: a file size limit (`RLIMIT_FSIZE`) makes a write
fail part way exactly as a full disk does (EFBIG instead of ENOSPC, from the same `write` call); see
tests/unit/store/test_failed_writes.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from dagster_project.generation.journal import Journal

_CHILD = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    from dagster_project.generation.journal import Journal, JournalWriteFailed

    path, limit = Path(sys.argv[1]), int(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the child
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        with Journal(path) as journal:
            for i in range(10_000):
                journal.append({"event_id": f"c{i}#turn0", "status": "ok", "text": "x" * 100})
    except JournalWriteFailed as exc:
        print(exc)
        sys.exit(3)
    """
)


def test_a_full_disk_names_the_journal_and_the_free_space_and_loses_no_answer_written_before(tmp_path):
    path = tmp_path / "work" / "journal.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), "20000"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
        timeout=60,
    )
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)
    message = done.stdout.strip()
    assert message.startswith(f"appending to the journal {path} failed: [Errno 27] File too large; ")
    assert " free of " in message and message.endswith("then rerun the shard")
    with Journal(path) as journal:  # the torn last line is cut off; every complete line is there
        kept = len(journal.entries)
        assert kept > 100 and set(journal.entries) == {f"c{i}#turn0" for i in range(kept)}
