"""False set-asides over long-tailed answers: how often the dispatcher's watchdog sets aside a healthy server.

    python -m benchmarks.bench_set_aside [--quick]

Every server here is healthy: each answers every request, after a time drawn for that request from a lognormal
(a few answers run for many minutes, as a shard's tail does), so every set-aside is a false one and every request
sent again (a hedge) is wasted GPU time. Four servers of cap 16, on the virtual clock of the dispatcher's tests
(tests/support/virtual_fleet.py: hours of a shard's tail in about a second of CPU), with the dispatcher's default
limits (silence 45 s, watchdog 120 s, unserved 15 s). Measured per tail shape: set-asides and hedges per 1,000
requests, with each server's `/metrics` served (an SGLang server: a read showing our requests running there is a
sign of progress) and without (a router or a proxy that hides them: only answers count). Baseline in the same run:
the silence rule before this measurement (silence counted from the last answer alone, reads showing our requests
running there not counted), with `/metrics` served.

Results go to the `set_aside` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.report import write_section
from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest
from dagster_project.generation.server_watch import SILENT, ServerWatch, WatchLimits
from tests.support.virtual_fleet import FakeServer, VirtualClockLoop, run_virtual

SERVERS = 4
CAP = 16
MAX_ANSWER_S = 1800.0  # the longest answer a server gives (about 30K tokens at ~17 tok/s per request)
# (median answer seconds, lognormal sigma): a chat set's answers, and a reasoning set's long tail.
TAILS = ((20.0, 0.8), (60.0, 1.2), (120.0, 1.5))
PARAMS = {"max_new_tokens": 32768}


class LongTailServer(FakeServer):
    """A healthy server whose every answer takes a time drawn from the tail (seeded per server)."""

    def __init__(self, url: str, tail: tuple[float, float], seed: int, *, metrics: bool):
        super().__init__(url, cap=CAP, metrics=metrics)
        self.rng, self.tail = random.Random(seed), tail

    async def generate(self, input_ids: Sequence[int], sampling_params: dict, rid: str | None = None, **kw):
        median, sigma = self.tail
        # Read by the parent before its first await: each request keeps its own duration.
        self.answer_s = min(self.rng.lognormvariate(math.log(median), sigma), MAX_ANSWER_S)
        return await super().generate(input_ids, sampling_params, rid, **kw)


class _SetAsides(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.reasons: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if "set aside (" in record.getMessage():
            self.reasons[record.getMessage().split("set aside (", 1)[1].split(")", 1)[0]] += 1


@dataclass(frozen=True)
class Result:
    tail: tuple[float, float]
    metrics: bool
    rule: str
    requests: int
    set_asides: Counter
    hedges: int
    hours: float

    def per_thousand(self, count: int) -> float:
        return 1000 * count / self.requests


def _verdict_before(self: ServerWatch, now: float, limits: WatchLimits, others_last_answer: float) -> str | None:
    """The baseline: the watchdog's rule before reads showing ours running counted against silence (silence from the
    last answer alone), the other two rules as they are."""
    if now - self.quiet_since >= limits.silence_s and others_last_answer > now - limits.silence_s:
        return SILENT
    return _VERDICT(self, now, limits, others_last_answer)


_VERDICT = ServerWatch.verdict


def measure(tail: tuple[float, float], metrics: bool, requests: int, *, rule_before: bool = False) -> Result:
    servers = {
        f"http://s{index}": LongTailServer(f"http://s{index}", tail, seed=index, metrics=metrics)
        for index in range(SERVERS)
    }
    loop = VirtualClockLoop()
    dispatcher = Dispatcher(list(servers), DispatchOptions(), clock=loop.time, connect=servers.__getitem__)
    work = [GenRequest(f"e{i}", [7, 8, 9, i], PARAMS) for i in range(requests)]
    done: set[str] = set()
    handler = _SetAsides()
    logger = logging.getLogger("dagster_project.generation.resend")  # where servers are set aside
    logger.addHandler(handler)
    if rule_before:
        ServerWatch.verdict = _verdict_before
    try:
        stats = run_virtual(dispatcher.run(work, lambda outcome: done.add(outcome.request.key)), loop)
    finally:
        logger.removeHandler(handler)
        ServerWatch.verdict = _VERDICT
    assert len(done) == requests, "every request ends once"
    rule = "before" if rule_before else "now"
    return Result(tail, metrics, rule, requests, handler.reasons, stats.hedges, loop.time() / 3600)


def render(results: list[Result]) -> str:
    lines = [
        "False set-asides: healthy servers answering long-tailed answers (every set-aside is a false one). "
        f"{SERVERS} servers of cap {CAP}, the dispatcher's default limits, on the virtual clock "
        "(`python -m benchmarks.bench_set_aside`).",
        "",
        "| answer time (median, sigma) | longest | /metrics | silence rule | requests | set-asides per 1,000 | reasons "
        "| hedges per 1,000 | virtual hours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        median, sigma = r.tail
        longest = min(median * math.exp(3 * sigma), MAX_ANSWER_S)  # the 99.9th percentile, capped
        reasons = ", ".join(f"{reason} {n}" for reason, n in r.set_asides.most_common()) or "none"
        lines.append(
            f"| {median:.0f} s, {sigma} | ~{longest / 60:.0f} min | {'served' if r.metrics else 'hidden'} | {r.rule} "
            f"| {r.requests:,} | {r.per_thousand(sum(r.set_asides.values())):.1f} | {reasons} "
            f"| {r.per_thousand(r.hedges):.1f} | {r.hours:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    args = parser.parse_args()
    requests = 300 if args.quick else 2000
    results = [
        measure(tail, metrics, requests, rule_before=before)
        for tail in TAILS
        for metrics in (True, False)
        for before in ((True, False) if metrics else (False,))  # without /metrics the two rules are one
    ]
    body = render(results)
    print(body)
    if not args.quick:
        write_section("set_aside", body)


if __name__ == "__main__":
    main()
