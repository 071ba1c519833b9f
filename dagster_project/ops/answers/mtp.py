"""2. MTP (speculative decoding): is it on, its accept length, and whether it pays (the last tuning sweep)."""

from __future__ import annotations

from dataclasses import dataclass

from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.text import fmt


@dataclass(frozen=True)
class MtpAnswer:
    speculative_algorithm: dict[str, str | None]
    mtp_on: bool
    accept_length_window: float | None
    accept_length_published_shards: float | None
    server_avg_spec_accept_length: dict[str, float | None]
    tuned: str | None = None  # the last `dflash tune`'s verdict on MTP at its recommended concurrency
    # What `mtp_on` was read from: "servers" (every healthy server says so), "accept_length" (no server reachable:
    # the answers our shards measured accepted more than one token per verify pass), or "unknown".
    mtp_on_from: str = "unknown"


# More than one token per verify pass is only possible with speculative decoding.
_SPECULATIVE_ACCEPT_LENGTH = 1.0


def _mtp_on(algorithms: dict[str, str | None], window: float | None, published: float | None) -> tuple[bool, str]:
    """The servers' own word while one is reachable; with the fleet down, the accept length our shards measured
    (the text, the page, `--json` and Prometheus all read this one answer)."""
    if algorithms:
        return all(algorithms.values()), "servers"
    measured = window if window is not None else published
    if measured is None:
        return False, "unknown"
    return measured > _SPECULATIVE_ACCEPT_LENGTH, "accept_length"


def answer_mtp(readings: Readings) -> MtpAnswer:
    """What each server runs, and the accept length measured on our own requests."""
    spec_tokens = sum(b.spec.window_spec_tokens for b in readings.live)
    spec_verify = sum(b.spec.window_verify_passes for b in readings.live)
    window_accept = spec_tokens / spec_verify if spec_verify else None
    lifetime_accepts = [
        accept
        for m in readings.published.values()
        if (accept := m.generation.spec.accept_length_lifetime)  # None or 0: the shard had no spec stats
    ]
    published_accept = sum(lifetime_accepts) / len(lifetime_accepts) if lifetime_accepts else None
    algorithms = {url: s.get("speculative_algorithm") for url, s in readings.fleet.items() if s.get("healthy")}
    mtp_on, mtp_on_from = _mtp_on(algorithms, window_accept, published_accept)
    return MtpAnswer(
        speculative_algorithm=algorithms,
        mtp_on=mtp_on,
        mtp_on_from=mtp_on_from,
        accept_length_window=window_accept,
        accept_length_published_shards=published_accept,
        server_avg_spec_accept_length={url: s.get("avg_spec_accept_length") for url, s in readings.fleet.items()},
        tuned=readings.tuning.speculative.verdict if readings.tuning and readings.tuning.speculative else None,
    )


def mtp_verdict(mtp: MtpAnswer) -> str:
    """ "MTP on (the servers say)": the words the text and the page both use for `mtp_on`."""
    source = {"servers": "the servers say", "accept_length": "no server reachable: from the accept length"}
    return f"MTP {'on' if mtp.mtp_on else 'OFF or unknown'} ({source.get(mtp.mtp_on_from, 'nothing measured')})"


def render_mtp(mtp: MtpAnswer) -> list[str]:
    algorithms = ", ".join(f"{url} {name or 'OFF'}" for url, name in mtp.speculative_algorithm.items())
    servers = ", ".join(f"{url} {fmt(accept, 2)}" for url, accept in mtp.server_avg_spec_accept_length.items())
    return [
        f"2. MTP (speculative decoding): {mtp_verdict(mtp)}",
        f"   algorithm per server: {algorithms or 'no server reachable'}",
        f"   accept length: window {fmt(mtp.accept_length_window, 2)}, published shards "
        f"{fmt(mtp.accept_length_published_shards, 2)}, servers' own average: {servers or '—'}",
        f"   does it pay (last dflash tune): {mtp.tuned or 'not measured (no tuning sweep)'}",
    ]
