"""Generate one shard's events: plan each conversation's turns, dispatch them, journal every outcome.

Exactly-once: every event id (`<conversation>#turn<k>`) ends as one final record in the journal — a
result, or an error with its kind and reason. A rerun after a crash skips every final record and
requests only what is missing; a multi-turn conversation resumes at the turn where it stopped, its
history rebuilt from the journal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dagster_project.conversations.turns import prompt_messages
from dagster_project.generation.dispatch import Dispatcher, GenRequest, Outcome
from dagster_project.generation.heartbeat import ShardReporter
from dagster_project.generation.journal import Journal
from dagster_project.generation.line_stop import LineStop
from dagster_project.generation.progress import Heartbeat, ShardProgress
from dagster_project.generation_settings import MIN_OUTPUT_TOKENS, GenerationSettings
from dagster_project.records import (
    HISTORY_GENERATED,
    PREVIOUS_TURN_FIT_CUT,
    PROMPT_FILLS_MAX_LENGTH,
    STATUS_ERROR,
    STATUS_EXCLUDED,
    STATUS_OK,
    Conversation,
    empty_completion_row,
)
from dagster_project.sglang.answer_contract import answer_text
from dagster_project.tokenizer import SpecialIds, render_prompt_ids, special_ids

PREVIOUS_TURN_FAILED = "previous_turn_failed"
PREVIOUS_TURN_INCOMPLETE = "previous_turn_incomplete"


def _needs_own_history(conversation: Conversation) -> bool:
    """Whether a turn's prompt holds the model's earlier answers (history `generated`), so a turn can only be
    asked once the one before it finished; with history `source` every prompt is the recorded context."""
    return conversation.history == HISTORY_GENERATED


@dataclass
class _Pending:
    conversation: Conversation
    turn: int


class ShardGeneration:
    """Everything one shard run needs; `run()` drives the dispatcher until every event has ended."""

    def __init__(
        self,
        shard: int,
        conversations: list[Conversation],
        tokenizer: Any,
        settings: GenerationSettings,
        journal: Journal,
        excluded: Mapping[str, tuple[str, str]] | None = None,
    ):
        """`excluded`: conversation id → (reason, why) of the conversations not to send (matched to an evaluation
        set): each of their turns ends as an `excluded` record with its reason, and nothing is requested."""
        self.shard = shard
        self.excluded = dict(excluded or {})
        self.conversations = conversations
        self.tokenizer = tokenizer
        self.special: SpecialIds = special_ids(tokenizer)
        self.settings = settings
        self.fingerprint = settings.fingerprint()
        self.sampling_params = settings.sampling_params()
        self.journal = journal
        self.dispatcher: Dispatcher | None = None
        self.line_stop: LineStop | None = None  # the quality watch: sees every answer, may stop admission
        total = sum(c.num_turns for c in conversations)
        resumed = sum(1 for c in conversations for t in range(c.num_turns) if journal.is_final(c.event_id(t)))
        self.progress = ShardProgress(shard, total, self.fingerprint, resumed_events=resumed)

    # ---- planning ---------------------------------------------------------------------------------

    def _history(self, conversation: Conversation, upto: int) -> list[dict[str, str]]:
        return [self.journal.entries[conversation.event_id(t)].history_message or {} for t in range(upto)]

    def _next_request(self, conversation: Conversation) -> GenRequest | None:
        """On resume: the first turn of `conversation` without a final record, or None when all have ended.

        Turns after a failed or unfinished turn cannot be generated (their history would be missing);
        they end as errors that inherit whether the cause is worth retrying, or, after an answer fit cut, are not
        sent (`_end_remaining`).
        """
        for turn in range(conversation.num_turns):
            entry = self.journal.entries.get(conversation.event_id(turn))
            if entry is None or not entry.final:
                return self._request(conversation, turn)
            if _needs_own_history(conversation) and (entry.status != STATUS_OK or entry.history_message is None):
                fit_cut = self.settings.cut_by_fit(entry.prompt_tokens, entry.completion_tokens, entry.finish_reason)
                self._end_remaining(conversation, turn, entry.status, entry.finish_reason, entry.retryable, fit_cut)
                return None
        return None

    def _request(self, conversation: Conversation, turn: int) -> GenRequest | None:
        """The turn's request; under `max_new_tokens: fit` capped at what the trainer's row leaves after its prompt,
        and None (the rest of the conversation excluded: later prompts are longer) when that is too little."""
        messages = prompt_messages(conversation, turn, self._history(conversation, turn))
        input_ids = render_prompt_ids(
            self.tokenizer,
            messages,
            enable_thinking=self.settings.enable_thinking,
            preserve_thinking=self.settings.preserve_thinking,
            tools=conversation.tools,
        )
        cap = self.settings.request_cap(len(input_ids))
        if cap < MIN_OUTPUT_TOKENS:
            fit = self.settings.fit_max_length
            why = f"its {len(input_ids):,}-token prompt leaves no room for an answer in fit_max_length {fit:,}"
            self._exclude(conversation, PROMPT_FILLS_MAX_LENGTH, why, from_turn=turn, prompt_tokens=len(input_ids))
            return None
        params = (
            self.sampling_params
            if cap == self.settings.max_new_tokens
            else {**self.sampling_params, "max_new_tokens": cap}
        )
        return GenRequest(
            key=conversation.event_id(turn),
            input_ids=input_ids,
            sampling_params=params,
            payload=_Pending(conversation, turn),
        )

    def _end_remaining(
        self,
        conversation: Conversation,
        failed_turn: int,
        status: str,
        finish_reason: str | None,
        retryable: bool,
        fit_cut: bool = False,
    ) -> None:
        """The turns after `failed_turn`, which cannot be asked without its answer: errors, or when `max_new_tokens:
        fit` cut that answer (`fit_cut`), not sent (the trainer cuts the conversation there: nothing is missing)."""
        if fit_cut:
            fit = self.settings.fit_max_length
            why = f"turn {failed_turn} of this conversation was cut at its fit_max_length {fit:,} budget"
            self._exclude(conversation, PREVIOUS_TURN_FIT_CUT, why, from_turn=failed_turn + 1)
            return
        if status == STATUS_OK:
            kind, cause = (
                PREVIOUS_TURN_INCOMPLETE,
                f"finished with finish_reason {finish_reason!r}, not a complete answer",
            )
        else:
            kind, cause = PREVIOUS_TURN_FAILED, "ended with an error"
        for turn in range(failed_turn + 1, conversation.num_turns):
            if self.journal.is_final(conversation.event_id(turn)):
                continue
            row = self._base_row(conversation, turn)
            row.update(
                status=STATUS_ERROR,
                error_kind=kind,
                error_message=f"not generated: turn {failed_turn} of this conversation {cause}",
                retryable=status != STATUS_OK and retryable,
            )
            self._journal(row)

    def _exclude(
        self, conversation: Conversation, reason: str, why: str, from_turn: int = 0, prompt_tokens: int = 0
    ) -> None:
        """`prompt_tokens`: of the turn `from_turn`'s rendered prompt, recorded on its row (the later turns' prompts,
        longer still, are never rendered): the store shows where the fit boundary fell."""
        for turn in range(from_turn, conversation.num_turns):
            row = self._base_row(conversation, turn)
            row.update(status=STATUS_EXCLUDED, error_kind=reason, error_message=f"not generated: {why}")
            if turn == from_turn:
                row.update(prompt_tokens=prompt_tokens)
            self._journal(row)  # a turn journaled before (generated, then quarantined) keeps its record

    def _admitting(self) -> bool:
        return self.line_stop is None or self.line_stop.admitting()

    def initial_requests(self) -> Iterator[GenRequest]:
        """Each conversation's next request; none once the line is held (the rest wait in the journal's gaps)."""
        for conversation in self.conversations:
            if not self._admitting():
                return
            if conversation.id in self.excluded:
                self._exclude(conversation, *self.excluded[conversation.id])
                continue
            request = self._next_request(conversation)
            if request is not None:
                yield request

    # ---- outcomes ---------------------------------------------------------------------------------

    def _base_row(self, conversation: Conversation, turn: int) -> dict[str, Any]:
        row = empty_completion_row()
        row.update(
            event_id=conversation.event_id(turn),
            conversation_id=conversation.id,
            turn_index=turn,
            num_turns=conversation.num_turns,
            policy=conversation.policy,
            source=conversation.source,
            shard=self.shard,
            settings_fingerprint=self.fingerprint,
            finished_at=time.time(),
            retryable=False,
            history_message=None,
        )
        return row

    def _outcome_row(self, outcome: Outcome) -> dict[str, Any]:
        pending: _Pending = outcome.request.payload
        row = self._base_row(pending.conversation, pending.turn)
        row.update(
            prompt_ids=outcome.request.input_ids,
            prompt_tokens=len(outcome.request.input_ids),
            server=outcome.server,
            attempts=outcome.attempts,
            client_latency_s=outcome.latency_s,
        )
        if outcome.error is not None:
            row.update(
                status=STATUS_ERROR,
                error_kind=outcome.error.kind,
                error_message=outcome.error.message,
                retryable=outcome.error.retryable,
            )
            return row
        result, meta = outcome.result, outcome.result.meta_info
        finish = result.finish_reason or {}
        row.update(
            status=STATUS_OK,
            rid=result.rid,
            output_ids=result.output_ids,
            text=answer_text(self._decode, result.output_ids, finish),  # never the server's: the ids' decoding
            finish_reason=finish.get("type"),
            finish_matched=None if finish.get("matched") is None else str(finish.get("matched")),
            prompt_tokens=meta.get("prompt_tokens", len(outcome.request.input_ids)),
            completion_tokens=meta.get("completion_tokens", len(result.output_ids)),
            cached_tokens=meta.get("cached_tokens"),
            spec_verify_ct=meta.get("spec_verify_ct"),
            spec_accept_length=meta.get("spec_accept_length"),
            spec_accept_rate=meta.get("spec_accept_rate"),
            spec_num_correct_drafts=meta.get("spec_num_correct_drafts"),
            spec_num_proposed_drafts=meta.get("spec_num_proposed_drafts"),
            e2e_latency_s=meta.get("e2e_latency"),
            weight_version=meta.get("weight_version"),
            served_model=outcome.served_model,
        )
        if pending.turn + 1 < pending.conversation.num_turns and _needs_own_history(pending.conversation):
            row["history_message"] = self._history_message(result.output_ids, row["finish_reason"])
        return row

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _history_message(self, output_ids: list[int], finish_reason: str | None) -> dict[str, str] | None:
        """What a later turn sees of this answer: its visible part (and its reasoning for preserve_thinking).

        An answer that did not finish (length cap, or thinking on and no `</think>`) cannot serve as history.
        With thinking off the prompt already closed the think block, so all of the output is the answer.
        """
        if finish_reason != "stop":
            return None
        if self.special.reasons and self.special.think_end in output_ids:
            cut = output_ids.index(self.special.think_end)
        elif not self.settings.enable_thinking or not self.special.reasons:
            cut = -1
        else:
            return None
        answer = [i for i in output_ids[cut + 1 :] if i not in self.special.eos_ids]
        reasoning = output_ids[: max(cut, 0)]
        if self.special.think_start in reasoning:  # a model that opens the think block itself (Qwen3)
            reasoning = reasoning[reasoning.index(self.special.think_start) + 1 :]
        return {
            "content": self.tokenizer.decode(answer, skip_special_tokens=True).strip(),
            "reasoning_content": self.tokenizer.decode(reasoning, skip_special_tokens=True).strip(),
        }

    def _journal(self, row: dict[str, Any]) -> None:
        if self.journal.append(row):
            self.progress.record(row)
            if self.line_stop is not None and row["status"] != STATUS_EXCLUDED:  # a turn not sent is no answer
                self.line_stop.observe(row)

    def on_outcome(self, outcome: Outcome) -> list[GenRequest]:
        row = self._outcome_row(outcome)
        self._journal(row)
        pending: _Pending = outcome.request.payload
        conversation, next_turn = pending.conversation, pending.turn + 1
        if next_turn >= conversation.num_turns or not self._admitting():
            return []  # held: the next turn has no record, and a rerun after the release asks it
        if _needs_own_history(conversation) and (row["status"] != STATUS_OK or row["history_message"] is None):
            fit_cut = row["status"] == STATUS_OK and self.settings.cut_by_fit(
                row["prompt_tokens"], row["completion_tokens"], row["finish_reason"]
            )
            self._end_remaining(
                conversation, pending.turn, row["status"], row["finish_reason"], row["retryable"], fit_cut
            )
            return []
        request = self._request(conversation, next_turn)
        return [request] if request is not None else []

    # ---- driving ----------------------------------------------------------------------------------

    async def run(self, dispatcher: Dispatcher, reporter: ShardReporter | None = None) -> Heartbeat:
        """Dispatch until every planned event has a record; the reporter beats alongside.

        The reporter ends only by failing (its lease was lost: another run took the shard over), and the line
        stop only by a hold whose in-flight requests did not drain in time; generation then stops at once and
        their error is raised.
        """
        self.dispatcher = dispatcher
        generating = asyncio.ensure_future(
            dispatcher.run(self.initial_requests(), self.on_outcome, remaining=self.progress.remaining_events)
        )
        reporting = asyncio.create_task(reporter.run()) if reporter else None
        watching = asyncio.create_task(self.line_stop.run()) if self.line_stop else None
        helpers = [task for task in (reporting, watching) if task is not None]
        try:
            if helpers:
                await asyncio.wait({generating, *helpers}, return_when=asyncio.FIRST_COMPLETED)
                for helper in helpers:
                    if helper.done() and not generating.done():
                        helper.result()  # raises why it stopped: a lost lease, or a hold not drained in time
            await generating
            self.progress.state = "generated"
        except BaseException:
            self.progress.state = "failed"
            generating.cancel()
            await asyncio.gather(generating, return_exceptions=True)
            raise
        finally:
            self.journal.sync()
            if watching is not None:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
                await self.line_stop.close_quietly(whole_shard=self.progress.state == "generated")
            if reporting is not None:
                reporting.cancel()
                await asyncio.gather(reporting, return_exceptions=True)
                await reporter.checkpoint_journal()
                await reporter.record_unrecorded()  # after the dispatcher's stop: what it aborted is counted
                await reporter.beat()
        return self.snapshot()

    def snapshot(self) -> Heartbeat:
        servers = self.dispatcher.snapshot().get("servers", {}) if self.dispatcher is not None else {}
        for view in servers.values():
            # Past its running cap a server queues what it is sent (FIFO): what this run has waiting there.
            cap = view.get("max_running_requests")
            view["queued_at_server"] = max(view["in_flight"] - cap, 0) if cap else None
        return self.progress.snapshot(servers=servers)

    def missing_events(self) -> list[str]:
        """Events without any record. Retryable errors count as ended here (a later run retries them)."""
        return [
            c.event_id(t)
            for c in self.conversations
            for t in range(c.num_turns)
            if c.event_id(t) not in self.journal.entries
        ]
