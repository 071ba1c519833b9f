"""Before a shard sends anything: can every server hold the longest request the configuration allows?

The longest request is the conversations stage's prompt budget (`max_prompt_tokens`, recorded in the
conversations manifest) plus the generation settings' `max_new_tokens`. SGLang 0.5.23 refuses or shortens
it in four places, each read from the server's `/server_info`:

* the prompt, counted with the draft tokens EAGLE reserves (`capacity.reserved_tokens`), must be shorter
  than `context_length` (managers/tokenizer_manager.py:1338-1350: 400 "longer than the model's context
  length");
* that count plus `max_new_tokens` must not exceed `context_length` (tokenizer_manager.py:1352-1376: 400
  "Requested token count exceeds");
* the prompt must be shorter than `max_req_input_len` = min(context − 1, KV pool − 1) − 5
  (managers/tp_worker.py:567-572, managers/utils.py:259-289: 400 "exceeds the maximum allowed length");
* `max_new_tokens` is silently clipped to `max_req_len − prompt − 1` (managers/scheduler.py:2708-2716), so
  prompt + `max_new_tokens` + 1 must fit in `max_req_len` = `max_req_input_len` + 5, or long answers are cut
  short as if they had hit the cap.

A failed check stops the run before any request, saying which server, which limit and which flag to change.
Servers that cannot be asked (a router has no `/server_info`, a server that is down) are left to the
dispatcher, which waits for them or sets them aside.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster_project.conversations.shards import read_conversations_manifest
from dagster_project.generation.dispatch import Dispatcher
from dagster_project.generation_settings import GenerationSettings
from dagster_project.sglang import capacity
from dagster_project.sglang.client import SGLangClient, SGLangError, new_session
from dagster_project.store.storage import Store

# The scheduler keeps this many tokens of `max_req_len` off every prompt (managers/tp_worker.py:572).
MAX_REQ_INPUT_MARGIN = 5


class BudgetError(RuntimeError):
    """A server cannot hold the configured request budget: the run must not start."""


@dataclass(frozen=True)
class RequestBudget:
    """The longest request a run may send: the prompt budget and the answer cap."""

    max_prompt_tokens: int
    max_new_tokens: int


@dataclass(frozen=True)
class ServerLimits:
    """The length limits of one server, from its `/server_info`."""

    context_length: int
    max_req_input_len: int
    max_total_num_tokens: int
    reserved_tokens: int  # EAGLE's draft tokens, counted with every prompt

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any]) -> ServerLimits:
        return cls(
            context_length=int(info["context_length"]),
            max_req_input_len=int(info["max_req_input_len"]),
            max_total_num_tokens=int(info["max_total_num_tokens"]),
            reserved_tokens=capacity.reserved_tokens(info),
        )

    @property
    def max_req_len(self) -> int:
        return self.max_req_input_len + MAX_REQ_INPUT_MARGIN

    @property
    def kv_binds(self) -> bool:
        """Whether the KV pool, not the context length, sets `max_req_input_len`."""
        return self.max_total_num_tokens < self.context_length


_KV_FLAGS = (
    "raise --mem-fraction-static (or set --max-total-tokens), or give the KV pool the memory the mamba state "
    "pool holds: a lower --max-running-requests with --disable-radix-cache, or a lower --mamba-full-memory-ratio"
)


def budget_problems(limits: ServerLimits, budget: RequestBudget) -> list[str]:
    """What the server would refuse or cut short for a request of the full budget (empty: it holds it)."""
    prompt, new = budget.max_prompt_tokens, budget.max_new_tokens
    counted = prompt + limits.reserved_tokens
    reserve = f" (+{limits.reserved_tokens} draft tokens reserved per prompt)" if limits.reserved_tokens else ""
    shape = f"max_prompt_tokens {prompt:,} + max_new_tokens {new:,}{reserve}"
    problems = []
    needed_context = max(counted + new, prompt + new + 2)  # the refusal, and the clip when context binds
    if limits.context_length < needed_context:
        problems.append(
            f"context_length {limits.context_length:,} < {needed_context:,} for {shape}: launch with "
            f"--context-length {needed_context:,} or more (`dflash fleet up --context-length`), or lower "
            "max_new_tokens (the generation resource) or max_prompt_tokens (the conversations config)"
        )
    needed_pool = prompt + new + 2  # the clip when the KV pool binds: max_req_len = pool − 1
    if limits.max_total_num_tokens < needed_pool:
        problems.append(
            f"the KV pool holds {limits.max_total_num_tokens:,} tokens (max_total_num_tokens), fewer than the "
            f"{needed_pool:,} one request of {shape} needs: {_KV_FLAGS}"
        )
    if not problems and limits.max_req_input_len <= prompt:
        flag = _KV_FLAGS if limits.kv_binds else "raise --context-length"
        problems.append(f"max_req_input_len {limits.max_req_input_len:,} <= max_prompt_tokens {prompt:,}: {flag}")
    if not problems and limits.max_req_len < prompt + new + 1:
        flag = _KV_FLAGS if limits.kv_binds else "raise --context-length"
        problems.append(
            f"max_req_len {limits.max_req_len:,} < {prompt + new + 1:,}: answers of a full-budget prompt would be "
            f"cut below max_new_tokens {new:,}: {flag}"
        )
    return problems


def check_server_infos(infos: Mapping[str, Mapping[str, Any] | None], budget: RequestBudget) -> list[str]:
    """Per server, what it cannot hold; servers without an answer (None) are skipped. Raises `BudgetError`."""
    failures, notes = [], []
    for url, info in infos.items():
        if info is None:
            notes.append(f"{url}: no /server_info (a router, or down): not checked")
            continue
        try:
            limits = ServerLimits.from_server_info(info)
        except (KeyError, TypeError, ValueError):
            notes.append(f"{url}: /server_info lacks the length limits: not checked")
            continue
        failures += [f"{url}: {problem}" for problem in budget_problems(limits, budget)]
    if failures:
        raise BudgetError(
            "the fleet cannot hold the configured request budget; nothing was sent:\n  " + "\n  ".join(failures)
        )
    return notes


async def fetch_server_infos(
    endpoints: Sequence[str], api_key: str | None = None, timeout_s: float = 30.0
) -> dict[str, dict[str, Any] | None]:
    """Each endpoint's `/server_info`, or None where there is none to read."""
    async with new_session() as session:

        async def one(url: str) -> dict[str, Any] | None:
            try:
                return await SGLangClient(url, api_key, session, probe_timeout_s=timeout_s).server_info()
            except SGLangError:
                return None

        return dict(zip(endpoints, await asyncio.gather(*(one(url) for url in endpoints))))


def check_fleet(
    endpoints: Sequence[str],
    budget: RequestBudget,
    *,
    api_key: str | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> None:
    """Stop (`BudgetError`) unless every server that answers can hold a request of the full budget."""
    infos = asyncio.run(fetch_server_infos(endpoints, api_key))
    for note in check_server_infos(infos, budget):
        log(f"preflight: {note}")
    checked = sum(info is not None for info in infos.values())
    log(
        f"preflight: {checked}/{len(infos)} servers hold prompts of {budget.max_prompt_tokens:,} tokens with "
        f"answers of {budget.max_new_tokens:,}"
    )


def check_before_dispatch(
    store: Store, settings: GenerationSettings, dispatcher: Dispatcher, log: Callable[[str], None]
) -> None:
    """The completions stage's check: the prompt budget the conversations were built with and the configured
    `max_new_tokens`, against every server the dispatcher will use."""
    conversations = read_conversations_manifest(store)
    if conversations is None:
        raise BudgetError(
            "no conversations manifest: its max_prompt_tokens is what the servers are checked against; "
            "materialize `conversations` first"
        )
    # Under `max_new_tokens: fit` no answer asks for more than the row holds (`request_cap` of an empty prompt).
    budget = RequestBudget(conversations.max_prompt_tokens, settings.request_cap(0))
    check_fleet(dispatcher.endpoints, budget, api_key=dispatcher.api_key, log=log)
