"""Injected failures, set at start (`--faults JSON`) or at run time (`POST /_sim/faults`).

Most faults shape a response and are read where the response is made; this module holds their state,
and the two that act on the process or the connection: a crash and a dropped connection.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from aiohttp import web

HUGE_BODY_BYTES = 50_000_000


@dataclass
class Faults:
    """Injected failures. Counted faults take an int (the next N requests) or true (every request)."""

    crash_after_requests: int | None = None  # exit the process when this many more requests have arrived
    crash_after_s: float | None = None  # exit the process this long after the fault is set
    drop: int | bool = 0  # close the connection before the answer (or mid-stream): no HTTP status
    hang: bool = False  # nothing progresses; /health and /health_generate answer 503 after the health timeout
    # /generate makes no progress while /health answers 200: a server whose generate path is lost behind a health
    # route that still answers (a proxy or router in front of it answering /health itself)
    hang_generate: bool = False
    slow: float = 1.0  # every request takes this many times longer
    # Non-streamed /generate answers: the status and headers at once, then the body at this many bytes a second (a
    # throttled link, a proxy that trickles): the server is done with the request while its answer is still arriving.
    trickle_bytes_per_s: float | None = None
    error_503: int | bool = 0  # answer 503 "The request queue is full." (E4)
    error_503_for_s: float | None = None  # ... for every request during this many seconds
    empty: int | bool = 0  # the answer is the EOS token alone
    truncate: int | bool = 0  # the answer is cut early with finish_reason length (a clipped request)
    mtp_off: bool = False  # no draft is accepted: spec_verify_ct equals the completion tokens
    nan: int | bool = 0  # the sampler drew an out-of-vocabulary id: stop "NaN happened", last id overwritten
    garbage: int | bool = 0  # 200 with an HTML error page for a body (a broken proxy in front of the server)
    # A bad model ("rehearse a bad model" in docs/OPERATIONS.md): this share of answers is the seed's disaster,
    # empty reasoning then "OK." and the end token (`\n</think>\n\nOK.<|im_end|>`, 6 tokens); which answers is
    # a draw per prompt, so every server of a fleet spoils the same ones.
    bad_model_share: float = 0.0
    bad_model_after_answers: int | None = None  # ... only after this server has answered this many more
    # Answers that break the answer contract (a proxy altering a share of the answers), each a share of them:
    overlong_answer_share: float = 0.0  # the ids repeated to twice max_new_tokens and one (counts to match)
    eos_mid_answer_share: float = 0.0  # the end-of-turn id written in the middle of output_ids
    foreign_text_share: float = 0.0  # a `text` that is not the decoding of output_ids
    huge_body_share: float = 0.0  # the text padded to 50 MB
    _503_until: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        self._crash_timer: asyncio.TimerHandle | None = None  # not a field: never reported, never cleared

    def update(self, changes: Mapping[str, Any], now: float) -> None:
        known = {f.name for f in fields(self) if not f.name.startswith("_")}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {sorted(known)}")
        if not isinstance(changes.get("slow", 1.0), (int, float)) or changes.get("slow", 1.0) < 1.0:
            raise ValueError("slow must be a number >= 1 (a slowdown factor)")
        trickle = changes.get("trickle_bytes_per_s")
        if trickle is not None and (not isinstance(trickle, (int, float)) or trickle <= 0):
            raise ValueError("trickle_bytes_per_s must be a rate > 0 (or null: answers at full speed)")
        for name, share in changes.items():
            if name.endswith("_share") and (not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0):
                raise ValueError(f"{name} must be a share in [0, 1]")
        after = changes.get("bad_model_after_answers")
        if after is not None and (not isinstance(after, int) or after < 0):
            raise ValueError("bad_model_after_answers must be a count >= 0 (or null: from now)")
        for name, value in changes.items():
            setattr(self, name, value)
        if "error_503_for_s" in changes:
            self._503_until = now + (changes["error_503_for_s"] or 0.0)

    def clear(self) -> None:
        """Back to no faults, in place: the scheduler holds this object and must see the change."""
        for f in fields(self):
            setattr(self, f.name, f.default)

    def take(self, name: str) -> bool:
        """Consume one occurrence of a counted fault; True when it applies to this request."""
        budget = getattr(self, name)
        if budget is True:
            return True
        if budget:
            setattr(self, name, budget - 1)
            return True
        return False

    def bad_answer(self, draw: float) -> bool:
        """Whether this answer is the bad model's, `draw` being its prompt's uniform draw in [0, 1); counts down
        `bad_model_after_answers` first (a fleet that goes bad mid-job)."""
        if self.bad_model_after_answers:
            self.bad_model_after_answers -= 1
            return False
        return draw < self.bad_model_share

    def break_contract(self, response: dict, max_new_tokens: int, end_id: int, draw: Callable[[], float]) -> None:
        """Alter a finished response as the contract faults say, each by its own draw in [0, 1)."""
        ids, meta = response["output_ids"], response["meta_info"]
        if ids and draw() < self.overlong_answer_share:
            wanted = 2 * max_new_tokens + 1
            ids = response["output_ids"] = (ids * (wanted // len(ids) + 1))[:wanted]
            meta["completion_tokens"] = meta["weight_versions"][0]["end"] = len(ids)
            if meta.get("spec_verify_ct"):  # what a status built on it would read: an absurd accept length
                meta["spec_accept_length"] = len(ids) / meta["spec_verify_ct"]
        if len(ids) > 2 and draw() < self.eos_mid_answer_share:
            ids[len(ids) // 2] = end_id
        if draw() < self.foreign_text_share:
            response["text"] = "A foreign text: not the decoding of these output ids."
        if draw() < self.huge_body_share:
            response["text"] += " " * HUGE_BODY_BYTES

    def rejects_with_503(self, now: float) -> bool:
        return now < self._503_until or self.take("error_503")

    @property
    def speed(self) -> float:
        return 0.0 if self.hang or self.hang_generate else 1.0 / self.slow

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    def count_arrival(self) -> None:
        """A request arrived: counts down `crash_after_requests`, crashing on the last one."""
        remaining = self.crash_after_requests
        if remaining is None:
            return
        if remaining <= 1:
            crash("crash_after_requests")
        self.crash_after_requests = remaining - 1

    def arm_crash_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        """(Re)start the `crash_after_s` countdown from now, or cancel it when that fault is unset."""
        if self._crash_timer is not None:
            self._crash_timer.cancel()
            self._crash_timer = None
        if self.crash_after_s is not None:
            self._crash_timer = loop.call_later(self.crash_after_s, crash, "crash_after_s")


def crash(reason: str) -> None:
    """A crashed SGLang server: every connection drops without a status line, later connects are refused."""
    print(f"simulator: injected crash ({reason}), exiting", file=sys.stderr, flush=True)
    os._exit(1)


def drop_connection(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()
    raise asyncio.CancelledError  # nothing may be written on a dropped connection
