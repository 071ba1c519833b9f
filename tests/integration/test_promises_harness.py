"""One harness of the promises (issue #43 item 9): a fixed set of seeded random jobs, each run through every stage
on the simulator and moto with its fault, then checked against every promise (`tests/support/harness/`):

* every input row accounted by id (a conversation or a quarantine record, credited to its own file);
* each planned event exactly once in the completions, and in the training set or excluded with a reason;
* every training row the official template's render of its conversation, then its answer;
* the answer contract on every published answer (max_new_tokens, the end-of-sequence id only at the end, `text`
  the decoding of `output_ids`);
* each request in flight once (a hung server's originals aborted by rid when re-sent);
* a server whose /generate hangs holds no other server's first request back;
* on healthy data: no hold, no blocked gate, no alert;
* the waste ledger's trained + pending + causes = the fleet's `generation_tokens_total`, within 1%
  (`invariants.LEDGER_TOLERANCE`, issue 44).

Each case names the seed and what it exercises; the cases that find a bug when it is put back say which
(RELIABILITY.md, "One harness of the promises"). `python -m benchmarks.soak_harness` (`make soak`) runs many more
seeds. Reproduce one case: `pytest tests/integration/test_promises_harness.py -k <case>`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from tests.support.chat_templates import official_template
from tests.support.harness.invariants import check_job
from tests.support.harness.jobs import build_job
from tests.support.harness.run import FleetPool, run_job


@dataclass(frozen=True)
class Case:
    name: str
    seed: int
    finds: str = ""  # the bug of issue 43 it finds when put back


# Ordered so the one that kills a server runs last: the shared fleet is restarted only after it.
CASES = [
    Case("healthy_hold_and_release", 115),
    Case("same_named_s3_objects", 3, "item 1: same-named S3 sources overwrite each other's download"),
    Case("contract_breaking_answers", 62, "item 2: answers breaking the request's contract stored as ok"),
    Case("hang_and_recover", 365, "item 7: a hung server's requests re-sent while their originals keep running"),
    Case("generate_hangs_behind_health", 10, "item 8: one hung /generate delays every server's first answer"),
    Case("s3_outage_mid_shard", 24),
    Case("server_sigkill", 7),
]


@pytest.fixture(scope="module")
def fleets(tmp_path_factory):
    pool = FleetPool(tmp_path_factory.mktemp("harness_fleet"))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def template() -> str:
    return official_template()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_seeded_job_keeps_every_promise(case, fleets, template, s3_server, tokenizer, tmp_path):
    job = build_job(case.seed)
    bucket = f"harness-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)
    run = run_job(job, tmp_path, s3_server, bucket, tokenizer, fleets)
    violations = check_job(run, tokenizer, template)
    assert not violations, (
        f"{job.describe()} ({case.finds or 'no known bug'}) broke {len(violations)} promise(s):\n  "
        + "\n  ".join(v[:400] for v in violations[:12])
    )
