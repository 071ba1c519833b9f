"""What an operator must be told without asking: the alerts of `status`, read from the answers (`ops.answers`), so
the terminal, the report page and its checks agree. The thresholds are configuration (`AlertThresholds`, the
`run_report` config).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster_project.conversations.shards import stale_conversations_fix
from dagster_project.generation.progress import ETA_FROM_WINDOW
from dagster_project.ops.answers.concurrency import (
    ConcurrencyAnswer,
    ServerConcurrency,
    describe_set_aside,
    describe_slow,
)
from dagster_project.ops.answers.mtp import MtpAnswer
from dagster_project.ops.answers.progress import ProgressAnswer
from dagster_project.ops.answers.quality import QualityAnswer, describe_figure
from dagster_project.ops.answers.shards import GateFailure, ShardsAnswer
from dagster_project.ops.answers.storage import StorageAnswer, retried_calls
from dagster_project.ops.answers.text import counts_in_line, shard_list
from dagster_project.pilot_record import PILOT_COMMAND, PilotRecord
from dagster_project.sglang.answer_contract import CUT_SHORT, breaches_of, describe


@dataclass(frozen=True)
class AlertThresholds:
    accept_length_floor: float = field(
        default=2.0, metadata={"help": "Alert when MTP's accept length (our window, or a server's) falls below this."}
    )
    eta_slip: float = field(
        default=0.25, metadata={"help": "Alert when the measured ETA exceeds the plan's by more than this fraction."}
    )
    publish_slow_s: float = field(
        default=120.0,
        metadata={"help": "Alert when a shard is still publishing this many seconds after its generation ended."},
    )
    store_retry_share: float = field(
        default=0.05,
        metadata={
            "help": "Alert when the shard runs retried more than this share of their store calls (S3 throttling "
            "with SlowDown, timeouts): nothing is lost, but the store slows the job."
        },
    )


DEFAULT_THRESHOLDS = AlertThresholds()


@dataclass(frozen=True)
class Alert:
    # mtp, server, slow_server, eta, shards, fleet, storage, blocked, overridden, damaged, export, pool, dead_runs,
    # daemon, hold, quality, pilot, tokenizer, conversations
    kind: str
    message: str


def raise_alerts(
    progress: ProgressAnswer,
    mtp: MtpAnswer,
    concurrency: ConcurrencyAnswer,
    storage: StorageAnswer,
    shards: ShardsAnswer | None = None,
    *,
    endpoints_known: bool,
    thresholds: AlertThresholds,
    held: bool = False,
) -> list[Alert]:
    """Every condition that needs an operator now, each in one sentence that says what to look at. `held`: the
    line is held, so no server has work (none is idle for want of it)."""
    return [
        *(_stage_alerts(shards) if shards else []),
        *_mtp_alerts(mtp, thresholds.accept_length_floor),
        *_store_alerts(storage, thresholds.store_retry_share),
        # A store too slow to answer leaves the shards' figures as of its last snapshot: whether work waits now is
        # not known, so an idle server is not blamed for it.
        *_server_alerts(progress, concurrency, shards_known=storage.delay is None and not held),
        *_other_model_alerts(concurrency),
        *_set_aside_alerts(concurrency),
        *_slow_server_alerts(concurrency),
        *_refused_answer_alerts(concurrency),
        *_eta_alerts(progress, thresholds.eta_slip),
        *_shard_alerts(progress, storage, thresholds.publish_slow_s),
        *_input_alerts(storage),
        *_fleet_alerts(concurrency, endpoints_known),
    ]


def pilot_alerts(pilot: PilotRecord | None) -> list[Alert]:
    """The last pilot was blocked: the fleet answers as its gates refused, and no shard starts with its settings
    until a pilot of them passes (unless the pilot is skipped)."""
    if pilot is None or pilot.passed:
        return []
    gate, message = min(pilot.failed_gates.items())  # the first by name, as they are listed
    return [
        Alert(
            "pilot",
            f"the {pilot.label()} (settings {pilot.settings_fingerprint}) was BLOCKED by "
            f"{', '.join(sorted(pilot.failed_gates))} ({gate}: {message.split(';')[0]}): the shards do not start "
            f"with these settings until a pilot of them passes. Fix the cause, then `{PILOT_COMMAND}`",
        )
    ]


def quality_alerts(quality: QualityAnswer) -> list[Alert]:
    """The line's hold (what holds it and the way out), and blocking figures drifting towards a hold."""
    if quality.hold is not None:
        return [Alert("hold", quality.hold.headline())]
    return [
        Alert(
            "quality",
            f"quality drifting: {describe_figure(figure)} over the answers arriving; the line is held when it "
            "crosses its threshold (`dflash status`, quality watch)",
        )
        for figure in quality.drifting
    ]


def _stage_alerts(shards: ShardsAnswer) -> list[Alert]:
    """Shards a gate blocks (one alert per gate), gates overridden, damaged objects, refused exports."""
    blocked: dict[tuple[str, str], list[tuple[int, GateFailure]]] = {}
    for state in shards.needs_a_look:
        for failure in state.blocked_by:
            blocked.setdefault((failure.stage, failure.gate), []).append((state.shard, failure))
    alerts = []
    for found in blocked.values():
        first_shard, failure = found[0]
        held = shard_list([shard for shard, _ in found])
        alerts.append(
            Alert(
                "blocked",
                f"shards {held} blocked by {failure.stage} gate {failure.gate} (not exported); shard {first_shard}: "
                f"{failure.message}. "
                + (f"Thresholds: {failure.thresholds}. " if failure.thresholds else "")
                + f"Having looked, to let them through: {failure.override}",
            )
        )
    overridden = [state for state in shards.needs_a_look if state.overridden]
    if overridden:
        gates = sorted({gate for state in overridden for gate in state.overridden})
        alerts.append(
            Alert(
                "overridden",
                f"failed gates overridden on shards {shard_list([state.shard for state in overridden])}: "
                f"{', '.join(gates)} (their rows go to training although the gates failed)",
            )
        )
    damaged = [problem for state in shards.needs_a_look for problem in state.damaged_objects]
    if damaged:
        shown = "; ".join(damaged[:5]) + (f"; … (+{len(damaged) - 5} more)" if len(damaged) > 5 else "")
        alerts.append(
            Alert(
                "damaged",
                f"damaged objects in the store: {shown} (materialize the stage each belongs to again, and what is "
                "built on it)",
            )
        )
    alerts += [
        Alert("export", f"specforge_export refused shard {state.shard}: {state.refused}")
        for state in shards.needs_a_look
        if state.refused and not state.blocked_by
    ]
    return alerts


def _mtp_alerts(mtp: MtpAnswer, floor: float) -> list[Alert]:
    off = sorted(url for url, algorithm in mtp.speculative_algorithm.items() if not algorithm)
    if off:
        return [Alert("mtp", f"MTP is off on {', '.join(off)}: restart them with speculative decoding (NEXTN)")]
    if mtp.accept_length_window is not None and mtp.accept_length_window < floor:
        return [
            Alert(
                "mtp",
                f"accept length {mtp.accept_length_window:.2f} on our recent requests is below {floor}: "
                "MTP is barely accepting drafts (check the servers' speculative settings and logs)",
            )
        ]
    if mtp.accept_length_window is None and mtp.accept_length_published_shards is not None:
        if mtp.accept_length_published_shards < floor:
            return [
                Alert(
                    "mtp",
                    f"accept length {mtp.accept_length_published_shards:.2f} of the published shards is below {floor}",
                )
            ]
    return []


def _store_alerts(storage: StorageAnswer, retry_share: float) -> list[Alert]:
    retried = sum(storage.store_retries.values())
    alerts = []
    if storage.store_calls and retried / storage.store_calls > retry_share:
        alerts.append(
            Alert(
                "storage",
                f"the store {storage.store} is slowing the job: {retried_calls(storage)}, over the run_report "
                f"config's store_retry_share of {retry_share:.0%}. Throttled prefixes (SlowDown) need fewer shard runs "
                "at once (DFLASH_SHARDS_PER_RUN, the pool's slots) or the bucket's request rate raised",
            )
        )
    if storage.delay is None:
        return alerts
    delay = storage.delay
    return alerts + [
        Alert(
            "storage",
            f"{delay.describe()}: the store {storage.store} did not answer within status's budget of "
            f"{delay.budget_s:g} s (DFLASH_STATUS_BUDGET_S); {delay.figures()}. The store is slow or failing, not "
            "the fleet",
        )
    ]


def _server_alerts(progress: ProgressAnswer, concurrency: ConcurrencyAnswer, *, shards_known: bool) -> list[Alert]:
    alerts = []
    # Shards that finished generating and are publishing have no work for the fleet: an idle server is theirs.
    generating = [shard for shard in progress.shards_running if shard not in progress.shards_publishing]
    work_waits = shards_known and bool(generating) and progress.events_remaining > 0
    # A server set aside, or serving another model, is sent no work: its own alert says why it idles.
    excluded = {server.url for server in concurrency.set_aside}
    for url, row in concurrency.servers.items():
        cap, running, queued = row.effective_cap, row.running, row.queued
        if cap is None or running is None:
            continue
        # A queue longer than a whole batch waits more than one batch's latency: more client concurrency
        # only adds latency (and timeouts) there, never throughput.
        if running >= cap and queued is not None and queued >= cap:
            alerts.append(
                Alert(
                    "server",
                    f"{url} is at its cap ({cap}) with {queued:.0f} queued, more than a whole batch: "
                    "lower the fleet resource's oversubscription or raise the server's cap",
                )
            )
        elif (
            running == 0 and work_waits and url not in excluded and row.other_model is None and not _no_work_ready(row)
        ):
            alerts.append(Alert("server", f"{url} is idle while shards {generating} have work waiting"))
    return alerts


def _no_work_ready(row: ServerConcurrency) -> bool:
    """The running shards send to this server, have room in their window there and none of their requests on it:
    their dispatchers fill every window greedily, so they have no request ready for it. What remains waits on
    earlier turns in flight elsewhere (a shard's tail of multi-turn conversations), not on this server."""
    return bool(row.client_window) and row.in_flight == 0


def _eta_alerts(progress: ProgressAnswer, slip: float) -> list[Alert]:
    eta, planned = progress.eta_hours, progress.plan_eta_hours
    # Only a stable window's ETA is judged: the lifetime rate of the first minutes swings with the first answers.
    from_window = progress.eta_basis == ETA_FROM_WINDOW
    if eta is None or not planned or not from_window or eta <= planned * (1 + slip):
        return []
    return [
        Alert(
            "eta",
            f"ETA {eta:,.2f} h is {eta / planned - 1:.0%} past the plan's {planned:,.2f} h (alert above {slip:.0%})",
        )
    ]


def _shard_alerts(progress: ProgressAnswer, storage: StorageAnswer, publish_slow_s: float) -> list[Alert]:
    alerts = []
    slow = {shard: seconds for shard, seconds in progress.shards_publishing.items() if seconds >= publish_slow_s}
    if slow:
        alerts.append(
            Alert(
                "storage",
                f"shards {sorted(slow)} still publishing {max(slow.values()):,.0f} s after their generation ended: "
                f"the store ({storage.store}) is slow or failing, not the fleet (each call is retried within the "
                "store's retry policy)",
            )
        )
    if progress.shards_dead:
        dead = progress.shards_dead
        alerts.append(Alert("shards", f"shard runs killed, not running: {dead} (materialize them again)"))
    if progress.shards_failed:
        alerts.append(Alert("shards", f"shard runs failed and unpublished: {progress.shards_failed}"))
    if storage.materialized_not_in_store:
        missing = storage.materialized_not_in_store
        alerts.append(Alert("storage", f"materialized in Dagster but not intact in the store: {missing}"))
    if storage.failed_uploads:
        alerts.append(Alert("storage", f"{storage.failed_uploads} uploads to the store failed (retried)"))
    if len(storage.settings_fingerprints) > 1:
        alerts.append(
            Alert(
                "storage", f"published shards mix generation settings: {counts_in_line(storage.settings_fingerprints)}"
            )
        )
    return alerts


def _input_alerts(storage: StorageAnswer) -> list[Alert]:
    """Shards whose inputs are not the job's: made under another tokenizer than other shards, or from conversations
    edited after they were made."""
    alerts = []
    if storage.tokenizers_mixed:
        alerts.append(
            Alert(
                "tokenizer",
                "published shards were made under different tokenizers (their prompts rendered otherwise): "
                + " | ".join(use.describe() for use in storage.tokenizers)
                + ". training_set refuses the shards of a tokenizer other than its run's; regenerate them under "
                "the job's tokenizer (DFLASH_TOKENIZER)",
            )
        )
    edited = storage.made_from_edited_conversations
    if edited:
        shards = sorted({shard for found in edited.values() for shard in found})
        alerts.append(
            Alert(
                "conversations",
                "shards made from conversations edited since they were made: "
                + "; ".join(f"{stage} {shard_list(found)}" for stage, found in edited.items())
                + f". training_set and the exports refuse them; shard {shards[0]}: {stale_conversations_fix(shards[0])}"
                + (f" (and likewise shards {shard_list(shards[1:])})" if len(shards) > 1 else ""),
            )
        )
    return alerts


def _other_model_alerts(concurrency: ConcurrencyAnswer) -> list[Alert]:
    """A server of the fleet that serves another model: every run sets it aside before its first request, during a
    run and after it, so it only takes a GPU."""
    return [
        Alert("server", f"{url}: {row.other_model}; no shard sends it work — stop it or point it at the right model")
        for url, row in concurrency.servers.items()
        if row.other_model is not None
    ]


def _set_aside_alerts(concurrency: ConcurrencyAnswer) -> list[Alert]:
    """Servers the running shards set aside, but for serving another model (`_other_model_alerts` names those) or
    for slowness (`_slow_server_alerts`)."""
    named = {url for url, row in concurrency.servers.items() if row.other_model is not None}
    named |= {server.url for server in concurrency.slow_servers}
    return [
        Alert("server", f"set aside: {describe_set_aside(server)}")
        for server in concurrency.set_aside
        if server.url not in named
    ]


def _slow_server_alerts(concurrency: ConcurrencyAnswer) -> list[Alert]:
    """Servers a shard run set aside for slowness, during the run and after it (its last heartbeat keeps the count):
    their requests were answered elsewhere, and the fleet ran short of them."""
    set_aside_now = {server.url: server for server in concurrency.set_aside}
    alerts = []
    for server in concurrency.slow_servers:
        now = set_aside_now.get(server.url)
        alerts.append(
            Alert(
                "slow_server",
                f"{server.url}: {describe_slow(server)}. Their requests were re-sent to other servers"
                + (f"; it is set aside now ({now.reason}) until a re-probe passes" if now else "")
                + ". Look at the path to it (a proxy, a load balancer, a congested link) and its log",
            )
        )
    return alerts


def _refused_answer_alerts(concurrency: ConcurrencyAnswer) -> list[Alert]:
    """A server answering 200 with what is not an answer: each was retried and none was stored, but the server is
    faulty. Answers that broke the answer contract are named by the rule they broke."""
    alerts = []
    for url, kinds in concurrency.refused_answers.items():
        broken = breaches_of(kinds)
        garbage = {kind: count for kind, count in kinds.items() if kind not in broken}
        if broken:
            alerts.append(
                Alert(
                    "server",
                    f"SERVER {url}: {sum(broken.values())} answers broke the contract: {describe(broken)} (each "
                    "retried, on another server where there is one; none stored): look at its log"
                    + (" and KV pool" if CUT_SHORT in broken else ""),
                )
            )
        if garbage:
            alerts.append(
                Alert(
                    "server",
                    f"{url} answered {sum(garbage.values())} requests with what is not an answer "
                    f"({', '.join(f'{kind} {count}' for kind, count in garbage.items())}; each retried, on another "
                    "server where there is one): look at its log",
                )
            )
    return alerts


def _fleet_alerts(concurrency: ConcurrencyAnswer, endpoints_known: bool) -> list[Alert]:
    down = sorted(url for url, row in concurrency.servers.items() if row.limited_by == "unreachable")
    if endpoints_known and not concurrency.servers:
        return [Alert("fleet", "no server answered")]
    if down and len(down) == len(concurrency.servers):
        return [Alert("fleet", f"the fleet is unreachable: {', '.join(down)}")]
    return [Alert("fleet", f"unreachable: {', '.join(down)}")] if down else []


def render_alerts(alerts: list[Alert]) -> list[str]:
    if not alerts:
        return ["Alerts: none"]
    return [f"Alerts ({len(alerts)}):", *(f"   ALERT [{alert.kind}]: {alert.message}" for alert in alerts)]
