"""The promises, checked after each job against what the pipeline stored and what the fleet itself recorded.

Each check returns its violations, one line each, prefixed by the promise's name; `check_job` runs them all. They
read the stores' published objects (manifests, Parquet rows, quarantine records), the simulators' request logs and
`sglang:generation_tokens_total`, and render prompts with `transformers`' `apply_chat_template` on the official
template, not the project's own rendering.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from dagster_project.conversations.shards import read_conversations
from dagster_project.conversations.stage import QUARANTINE_KEY as PREPARE_QUARANTINE_KEY
from dagster_project.conversations.turns import prompt_messages
from dagster_project.generation.line_hold import read_hold, read_hold_log
from dagster_project.generation.shards import iter_completion_batches, read_completions_manifest
from dagster_project.ingest.shards import QUARANTINE_KEY as INGEST_QUARANTINE_KEY
from dagster_project.ops.status import collect_status
from dagster_project.records import HISTORY_GENERATED, STATUS_OK, Conversation
from dagster_project.store.jsonl import read_jsonl_zst
from dagster_project.tokenizer import special_ids, tokenizer_profile
from dagster_project.tool_calls import parse_tool_calls
from dagster_project.training import gate_result, gate_sets, gates
from dagster_project.training.lengths import LengthGateOptions
from dagster_project.training.shards import iter_training_batches, read_training_manifest
from dagster_project.training.tool_call_gate import ToolCallGateOptions
from tests.support.chat_templates import official_prompt_ids
from tests.support.harness.jobs import Fault, Layout
from tests.support.harness.run import JobRun
from tests.support.sglang_fixtures import PROBE_HASH

# The waste ledger's trained + pending + causes against the fleet's own count of the tokens it generated (issue 44):
# equal within this share of the fleet's count.
LEDGER_TOLERANCE = 0.01
LEDGER = "ledger"
GENERATED_ANSWER_OUTCOMES = ("stop", "length")  # a request the server generated to its end and answered
HARNESS_HOLD_GATE = "harness_rehearsal"


def _violation(promise: str, message: str) -> str:
    return f"{promise}: {message}"


class Stored:
    """What the job left in the store, read once."""

    def __init__(self, run: JobRun):
        store, job = run.store, run.job
        downloads = run.root / "checked"
        self.conversations: dict[int, list[Conversation]] = {}
        for shard in range(job.num_shards):
            try:
                self.conversations[shard] = list(read_conversations(store, shard))
            except LookupError:
                self.conversations[shard] = []
        self.quarantined: list[dict[str, Any]] = []
        for key in (INGEST_QUARANTINE_KEY, PREPARE_QUARANTINE_KEY):
            if store.exists(key):
                self.quarantined += list(read_jsonl_zst(store.download(key, downloads / key)))
        self.completions: dict[int, list[dict]] = {}
        self.training: dict[int, list[dict]] = {}
        for shard in range(job.num_shards):
            if read_completions_manifest(store, shard) is not None:
                self.completions[shard] = _rows(iter_completion_batches(store, shard))
            if read_training_manifest(store, shard) is not None:
                self.training[shard] = _rows(iter_training_batches(store, shard))

    def all_conversations(self) -> Iterator[Conversation]:
        for conversations in self.conversations.values():
            yield from conversations


def _rows(batches: Iterator[pa.RecordBatch]) -> list[dict]:
    return [row for batch in batches for row in batch.to_pylist()]


def stages_ran(run: JobRun, stored: Stored) -> list[str]:
    return [
        _violation("stages", failure.strip().splitlines()[-1] + f" ({failure[:200]!r})") for failure in run.failures
    ]


def fault_took_effect(run: JobRun, stored: Stored) -> list[str]:
    """The job's fault happened (a harness that injected nothing would prove nothing)."""
    if run.failures:
        return []
    proxy = run.answer_proxy
    took_effect = {
        Fault.NONE: True,
        Fault.KILL: any(server.killed for server in run.servers),
        Fault.HANG_AND_RECOVER: bool(run.resent_rids),
        Fault.BROKEN_ANSWERS: proxy is not None and bool(proxy.broken),
        Fault.GENERATE_HANGS: proxy is not None and bool(proxy.held),
        Fault.S3_OUTAGE: run.s3_refused > 0,
    }[run.job.fault]
    return [] if took_effect else [_violation("harness", f"the fault {run.job.fault.value} did not take effect")]


def rows_accounted(run: JobRun, stored: Stored) -> list[str]:
    """Every input row ends once, by its id, in a conversation or a quarantine record, credited to its own file."""
    promise = "rows accounted by id"
    violations: list[str] = []
    where: dict[str, list[tuple[str, int, str]]] = defaultdict(list)  # id → (source_file, row, outcome)
    by_position: set[tuple[str, int]] = set()
    for conversation in stored.all_conversations():
        row_id = conversation.extra.get("source_id")
        where[row_id].append((conversation.source_file, conversation.source_row, "kept"))
        first_user = next(m for m in conversation.messages if m["role"] == "user")
        if not str(first_user["content"]).startswith(f"[{row_id}]"):
            violations.append(_violation(promise, f"conversation {row_id} holds another row's text"))
    unreadable: set[str] = set()
    for record in stored.quarantined:
        by_position.add((record["source_file"], record["source_row"]))
        if record["reason"] == "unreadable_file":
            unreadable.add(record["source_file"])
        if record.get("id") is not None:
            where[record["id"]].append((record["source_file"], record["source_row"], record["reason"]))
    expected: set[str] = set()
    for file in run.job.files:
        uri = run.uris[file.name]
        if file.noise_bytes and uri not in unreadable:
            violations.append(_violation(promise, f"{uri} is not named unreadable"))
        for position, row in enumerate(file.rows):
            if row.id is None:
                if (uri, position) not in by_position and uri not in unreadable:
                    violations.append(_violation(promise, f"{uri} line {position} (not a row) is not quarantined"))
                continue
            expected.add(row.id)
            found = where.get(row.id, [])
            if not found:
                if file.layout is not Layout.BROKEN_GZIP or uri not in unreadable:
                    violations.append(_violation(promise, f"row {row.id} of {uri} is lost"))
            elif len(found) > 1:
                violations.append(_violation(promise, f"row {row.id} of {uri} ends {len(found)} times: {found}"))
            elif found[0][:2] != (uri, position):
                violations.append(
                    _violation(promise, f"row {row.id} of {uri}:{position} is credited to {found[0][0]}:{found[0][1]}")
                )
    phantoms = sorted(set(where) - expected - {None})
    if phantoms:
        violations.append(_violation(promise, f"{len(phantoms)} rows no input holds, e.g. {phantoms[:3]}"))
    return violations


def events_once(run: JobRun, stored: Stored) -> list[str]:
    """Each planned event exactly once in the completions; in the training set once, or excluded with a reason."""
    promise = "events exactly once"
    violations: list[str] = []
    for shard, conversations in stored.conversations.items():
        if not conversations:
            continue
        planned = {c.event_id(t) for c in conversations for t in range(c.num_turns)}
        if shard not in stored.completions:
            violations.append(_violation(promise, f"shard {shard}: {len(planned)} planned events, none published"))
            continue
        counted = Counter(row["event_id"] for row in stored.completions[shard])
        twice = sorted(e for e, n in counted.items() if n > 1)
        missing, unplanned = sorted(planned - set(counted)), sorted(set(counted) - planned)
        for what, events in (("recorded twice", twice), ("missing", missing), ("not planned", unplanned)):
            if events:
                violations.append(_violation(promise, f"shard {shard}: {len(events)} events {what}, e.g. {events[:3]}"))
        if shard not in stored.training:
            violations.append(_violation(promise, f"shard {shard}: completions published, no training set"))
            continue
        trained = Counter(row["event_id"] for row in stored.training[shard])
        if any(n > 1 for n in trained.values()) or set(trained) - set(counted):
            violations.append(_violation(promise, f"shard {shard}: training rows twice or not from completions"))
        manifest = read_training_manifest(run.store, shard)
        excluded = sum(manifest.exclusions.values())
        if len(trained) + excluded != len(counted):
            summary = f"{len(trained)} trained + {excluded} excluded with a reason != {len(counted)} events"
            violations.append(_violation(promise, f"shard {shard}: {summary} ({manifest.exclusions})"))
    return violations


def ledger_balances(run: JobRun, stored: Stored) -> list[str]:
    """trained + pending + every cause of the waste ledger = every output token the fleet generated, within
    `LEDGER_TOLERANCE`."""
    if not run.servers or run.failures or run.job.fault is Fault.BROKEN_ANSWERS:
        return []  # broken answers: their ids are the proxy's, not tokens the fleet generated
    waste = collect_status(run.store, []).waste
    ledger = waste.trained_output_tokens + waste.pending_output_tokens + waste.wasted_output_tokens
    fleet = sum(server.generated_tokens for server in run.servers)
    if abs(ledger - fleet) <= LEDGER_TOLERANCE * fleet:
        return []
    return [
        _violation(
            LEDGER,
            f"the waste ledger accounts {ledger} output tokens (trained {waste.trained_output_tokens}, pending "
            f"{waste.pending_output_tokens}, causes {waste.output_tokens}), the fleet generated {fleet:.0f} "
            f"(sglang:generation_tokens_total): more than {LEDGER_TOLERANCE:.0%} apart",
        )
    ]


def answer_contract(run: JobRun, stored: Stored, tokenizer: Any) -> list[str]:
    """A published answer keeps its request's contract: at most its max_new_tokens ids, an end-of-sequence id only
    at its end, and `text` the decoding of its ids."""
    promise = "answer contract"
    eos = set(special_ids(tokenizer).eos_ids)
    violations: list[str] = []
    for rows in stored.completions.values():
        for row in rows:
            if row["status"] != STATUS_OK:
                continue
            ids, event = row["output_ids"], row["event_id"]
            cap = run.settings.request_cap(len(row["prompt_ids"]))
            if len(ids) > cap:
                violations.append(_violation(promise, f"{event}: {len(ids)} output ids, max_new_tokens {cap}"))
            if any(i in eos for i in ids[:-1]):
                violations.append(_violation(promise, f"{event}: an end-of-sequence id before the answer's end"))
            answer = ids[:-1] if ids and ids[-1] in eos else ids
            if row["text"] != tokenizer.decode(answer, skip_special_tokens=True):
                violations.append(_violation(promise, f"{event}: text is not the decoding of output_ids"))
    return violations


def _generated_history(output_ids: list[int], tokenizer: Any) -> dict[str, Any]:
    special = special_ids(tokenizer)
    answer = output_ids[:-1] if output_ids and output_ids[-1] in special.eos_ids else output_ids
    reasoning, _, content = tokenizer.decode(answer).rpartition("</think>")
    return {"content": content.strip(), "reasoning_content": reasoning.removeprefix("<think>").strip()}


def rows_render(run: JobRun, stored: Stored, tokenizer: Any, template: str) -> list[str]:
    """Every training row is the official template's render of its conversation up to its turn, then the answer."""
    promise = "training row = template render"
    violations: list[str] = []
    for shard, rows in stored.training.items():
        conversations = {c.id: c for c in stored.conversations[shard]}
        answers = {row["event_id"]: row["output_ids"] for row in stored.completions.get(shard, [])}
        for row in rows:
            conversation = conversations[row["conversation_id"]]
            turn = row["turn_index"]
            earlier = [answers.get(conversation.event_id(t)) for t in range(turn)]
            if conversation.history == HISTORY_GENERATED and any(
                ids is None or parse_tool_calls(tokenizer.decode(ids)).calls for ids in earlier
            ):
                continue  # an earlier answer is missing, or a call the history would render as such: not rendered here
            history = [_generated_history(ids, tokenizer) for ids in earlier]
            messages = prompt_messages(conversation, turn, history)
            prompt = official_prompt_ids(
                tokenizer, template, messages, tools=conversation.tools, enable_thinking=run.settings.enable_thinking
            )
            output = answers[row["event_id"]]
            expected = (prompt + output)[: len(row["input_ids"])]
            if row["input_ids"] != expected or len(row["input_ids"]) < len(prompt):
                violations.append(_violation(promise, f"{row['event_id']}: input_ids are not the render"))
            elif list(row["loss_mask"][: len(prompt)]) != [0] * len(prompt):
                violations.append(_violation(promise, f"{row['event_id']}: the prompt is supervised"))
            elif sum(row["loss_mask"]) != len(row["input_ids"]) - len(prompt):
                violations.append(_violation(promise, f"{row['event_id']}: the answer is not wholly supervised"))
    return violations


def in_flight_once(run: JobRun, stored: Stored) -> list[str]:
    """Each request is in flight once: a request re-sent from a hung server has its original aborted by its rid (a
    hung server takes no abort: it is sent once the server answers again), and no prompt is generated to its end
    twice unless its answer was refused."""
    promise = "each request in flight once"
    violations = []
    if run.answer_proxy is not None and run.recovered_at is not None:
        running = sorted(run.resent_rids - set(run.answer_proxy.aborts))
        if running:
            violations.append(
                _violation(
                    promise,
                    f"{len(running)} of {len(run.resent_rids)} requests of the hung server were re-sent elsewhere "
                    f"while their originals kept running (never aborted by rid), e.g. {running[:2]}",
                )
            )
    refused = Counter(b.input_hash for b in run.answer_proxy.broken) if run.answer_proxy else Counter()
    answered: Counter = Counter()
    for server in run.servers:
        for entry in server.requests:
            if entry["input_hash"] != PROBE_HASH and entry["outcome"] in GENERATED_ANSWER_OUTCOMES:
                answered[entry["input_hash"]] += 1
    # A hung server's original that finished before its abort could reach it (the server answers again, then the
    # dispatcher's re-probe aborts it): the dispatcher did what it can; an original never aborted is reported above.
    aborted = set(run.answer_proxy.aborts) if run.answer_proxy else set()
    raced = {
        entry["input_hash"]
        for server in run.servers
        for entry in server.requests
        if entry.get("rid") in aborted and entry.get("rid") in run.resent_rids
    }
    twice = {h: n for h, n in answered.items() if n > 1 + refused[h] and h not in raced}
    if twice:
        extra = sum(twice.values()) - len(twice)
        violations.append(
            _violation(promise, f"{len(twice)} prompts generated to their end twice or more: {extra} too many")
        )
    return violations


def first_answer_not_held_back(run: JobRun, stored: Stored) -> list[str]:
    """A server whose /generate hangs does not hold back the others: they get their first request while its first
    request still hangs (`answer_proxy.HeldRequest`), not once its client gives up on it. Judged by order, not by
    how long anything took: held back, the healthy servers' first request comes after the client gave up."""
    if run.job.fault is not Fault.GENERATE_HANGS or run.answer_proxy is None or not run.answer_proxy.held:
        return []
    first_held = min(run.answer_proxy.held, key=lambda h: h.arrived_at)
    healthy = [
        entry["received_at"]
        for server in run.servers
        if server.url != run.answer_proxy.target
        for entry in server.requests
        if entry["input_hash"] != PROBE_HASH
    ]
    if not healthy or first_held.client_gone_at is None:
        return []  # nothing to hold back, or the hung request outlived the run: nobody waited for it
    if min(healthy) < first_held.client_gone_at:
        return []
    waited, held_for = min(healthy) - first_held.arrived_at, first_held.client_gone_at - first_held.arrived_at
    return [
        _violation(
            "first answer not held back",
            f"the healthy servers got their first request {waited:.1f} s after the hung server's first /generate, "
            f"as its client gave up on it ({held_for:.1f} s): every server waited for the hung one",
        )
    ]


def healthy_run_is_quiet(run: JobRun, stored: Stored, tokenizer: Any) -> list[str]:
    """On healthy data: no hold (but the harness's own, released), no blocked gate, no alert."""
    if not run.job.healthy_data or run.failures:
        return []
    promise = "healthy data: no hold, no blocked gate, no alert"
    violations = []
    if read_hold(run.store) is not None:
        violations.append(_violation(promise, f"a hold is in force: {read_hold(run.store).headline()}"))
    for hold in read_hold_log(run.store).released:
        if hold.gate != HARNESS_HOLD_GATE:
            violations.append(_violation(promise, f"the line was held by {hold.gate}: {hold.message}"))
    for shard in stored.training:
        for result in _gates(run, stored, shard, tokenizer):
            if not result.passed:
                violations.append(_violation(promise, f"shard {shard} gate {result.name}: {result.message}"))
    for alert in collect_status(run.store, []).alerts:
        violations.append(_violation(promise, f"alert {alert.kind}: {alert.message}"))
    return violations


def _gates(run: JobRun, stored: Stored, shard: int, tokenizer: Any) -> list[gate_result.GateResult]:
    """The completions and training-set gates at their default thresholds, as their checks run them."""
    special = special_ids(tokenizer)
    completions = pa.Table.from_pylist(stored.completions[shard])
    training = pa.Table.from_pylist(stored.training[shard])
    manifest = read_completions_manifest(run.store, shard)
    counts = gate_sets.EventCounts(
        rows=manifest.rows,
        errors=manifest.errors,
        errors_by_kind=manifest.generation.errors_by_kind,
        length_capped=manifest.generation.finish_reasons.get("length", 0) - manifest.generation.cut_by_fit,
        max_new_tokens=manifest.settings.max_new_tokens,
    )
    thresholds = gates.GateThresholds()
    answer_profile = gates.profile_completion_batches(
        completions.select(gates.COMPLETION_GATE_COLUMNS).to_batches(), special, tokenizer.decode
    )
    results = gate_sets.completions_gates(
        counts,
        answer_profile,
        vocab_size=special.vocab_size,
        enable_thinking=run.settings.enable_thinking,
        thresholds=thresholds,
        limits=gate_sets.CompletionShareLimits(),
    )
    if training.num_rows:
        row_profile = gates.profile_training_batches(
            training.select(gates.TRAINING_GATE_COLUMNS).to_batches(), special, tokenizer.decode
        )
        results += gate_sets.training_gates(
            row_profile,
            completions.select(["event_id", "prompt_ids", "output_ids"]).to_batches(),
            read_training_manifest(run.store, shard).lengths,
            vocab_size=special.vocab_size,
            enable_thinking=run.settings.enable_thinking,
            thresholds=thresholds,
            tool_calls=ToolCallGateOptions(),
            tool_calls_known=tokenizer_profile(tokenizer).tool_calls_known,
            length=LengthGateOptions(),
        )
    return results


def check_job(run: JobRun, tokenizer: Any, template: str) -> list[str]:
    """Every promise's violations."""
    stored = Stored(run)
    checks: list[Callable[[], list[str]]] = [
        lambda: stages_ran(run, stored),
        lambda: fault_took_effect(run, stored),
        lambda: rows_accounted(run, stored),
        lambda: events_once(run, stored),
        lambda: answer_contract(run, stored, tokenizer),
        lambda: rows_render(run, stored, tokenizer, template),
        lambda: in_flight_once(run, stored),
        lambda: first_answer_not_held_back(run, stored),
        lambda: healthy_run_is_quiet(run, stored, tokenizer),
        lambda: ledger_balances(run, stored),
    ]
    return [v for check in checks for v in check()]
