"""The startup check: a server whose context or KV pool cannot hold the longest configured request stops the
run, naming the flag to change (limits as SGLang 0.5.23 applies them: see generation/preflight.py)."""

from __future__ import annotations

import pytest

from dagster_project.generation.preflight import (
    BudgetError,
    RequestBudget,
    ServerLimits,
    budget_problems,
    check_server_infos,
)

# The defaults: conversations' max_prompt_tokens 16,384, generation's max_new_tokens 32,768.
BUDGET = RequestBudget(max_prompt_tokens=16384, max_new_tokens=32768)


def info(context: int = 65536, pool: int = 189_327, speculative: bool = True) -> dict:
    """The /server_info length fields of a server (`max_req_input_len` as tp_worker.py:567-572 derives it)."""
    return {
        "context_length": context,
        "max_total_num_tokens": pool,
        "max_req_input_len": min(context - 1, pool - 1) - 5,
        "speculative_algorithm": "EAGLE" if speculative else None,
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
    }


def test_the_launch_defaults_hold_the_default_budget():
    assert budget_problems(ServerLimits.from_server_info(info()), BUDGET) == []
    assert check_server_infos({"http://a:30000": info()}, BUDGET) == []


def test_a_short_context_names_context_length_and_counts_the_draft_reserve():
    # 16,384 + 32,768 + 4 reserved = 49,156 tokens: a 49,152-token context refuses it (tokenizer_manager.py:1352).
    (problem,) = budget_problems(ServerLimits.from_server_info(info(context=49152)), BUDGET)
    assert "context_length 49,152 < 49,156" in problem and "--context-length 49,156" in problem
    assert "+4 draft tokens reserved" in problem
    assert budget_problems(ServerLimits.from_server_info(info(context=49156)), BUDGET) == []
    # Without speculative decoding nothing is reserved, but an answer is clipped to max_req_len − prompt − 1
    # (scheduler.py:2708-2716) with max_req_len = context − 1: 2 tokens of room are needed.
    plain = ServerLimits.from_server_info(info(context=49154, speculative=False))
    assert budget_problems(plain, BUDGET) == [] and plain.reserved_tokens == 0
    assert budget_problems(ServerLimits.from_server_info(info(context=49153, speculative=False)), BUDGET)


def test_a_small_kv_pool_names_the_memory_flags():
    (problem,) = budget_problems(ServerLimits.from_server_info(info(pool=40_000)), BUDGET)
    assert "the KV pool holds 40,000 tokens" in problem and "49,154" in problem
    assert "--mem-fraction-static" in problem and "--max-total-tokens" in problem
    assert "--max-running-requests" in problem  # the state pool's memory is the other way to a bigger KV pool


def test_max_req_input_len_is_checked_even_when_the_totals_fit():
    # A server that reports a smaller max_req_input_len than its context and pool imply (a DLLM block, say).
    odd = {**info(), "max_req_input_len": 16000}
    (problem,) = budget_problems(ServerLimits.from_server_info(odd), BUDGET)
    assert "max_req_input_len 16,000 <= max_prompt_tokens 16,384" in problem and "--context-length" in problem


def test_the_fleet_check_stops_on_any_server_and_skips_those_without_server_info():
    infos = {"http://a:30000": info(), "http://b:30001": info(context=32768), "http://router:30000": None}
    with pytest.raises(BudgetError) as caught:
        check_server_infos(infos, BUDGET)
    message = str(caught.value)
    assert "nothing was sent" in message and "http://b:30001: context_length 32,768" in message
    assert "http://a:30000" not in message
    notes = check_server_infos({"http://router:30000": None, "http://c:1": {"context_length": 1}}, BUDGET)
    assert [note.split(":")[0:2] for note in notes] == [["http", "//router"], ["http", "//c"]]
