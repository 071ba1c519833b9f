"""The protocol facts the pipeline relies on, checked against one server: a real SGLang 0.5.23 server when
`SGLANG_TEST_SERVER_URL` points at one (scripts/gpu_check.sh does), else a simulator started here.

Only what holds for any weights is asserted (random weights never stop by themselves, so answers end on
their length): response shapes and meta_info, spec-decoding invariants, the length errors with the EAGLE
draft reserve, the closed sampling schema, aborts by rid, the ops routes, and the `/server_info` fields the
capacity model and the startup check read.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from dagster_project.generation.preflight import RequestBudget, ServerLimits, budget_problems
from dagster_project.sglang import capacity
from dagster_project.sglang import client as sgl
from dagster_project.sglang import protocol as proto
from dagster_project.tokenizer import render_prompt_ids, special_ids
from tests.support.sglang_fixtures import SimFleet, call, wait_until

REAL = os.environ.get("SGLANG_TEST_SERVER_URL")
PARAMS = proto.sampling_params(max_new_tokens=32)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if REAL:
        yield REAL.rstrip("/")
        return
    options = {"enable_metrics": True, "output_len": "uniform:8:48", "decode_step_s": 0.002, "max_running_requests": 8}
    with SimFleet.start(1, tmp_path_factory.mktemp("protocol"), options) as fleet:
        yield fleet.url(0)


@pytest.fixture(scope="module")
def info(server) -> dict:
    return call(server + "/server_info")[1]


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return render_prompt_ids(tokenizer, [{"role": "user", "content": "What is 2 + 2? Answer briefly."}])


def test_health_and_ops_routes(server):
    assert call(server + "/health")[0] == 200 and call(server + "/health_generate")[0] == 200
    status, metrics = call(server + "/metrics")
    assert status == 200
    parsed = proto.parse_metrics(metrics)
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:spec_accept_length"):
        assert name in parsed, name


def test_server_info_has_what_capacity_and_the_startup_check_read(info):
    state = info["internal_states"][0]
    assert info["speculative_algorithm"] == "EAGLE"  # NEXTN resolves to EAGLE
    assert state["effective_max_running_requests_per_dp"] >= 1
    assert capacity.reserved_tokens(info) == 4  # max(topk 1 × steps 3, 4 draft tokens)
    limits = ServerLimits.from_server_info(info)
    assert limits.max_req_input_len == min(limits.context_length - 1, limits.max_total_num_tokens - 1) - 5
    report = capacity.analyze(info, 600, 2000)
    assert report.cap == state["effective_max_running_requests_per_dp"] and report.explain().startswith("cap ")
    # The check agrees with the server about a budget right at its limit and one token past it.
    largest = RequestBudget(128, limits.context_length - 128 - limits.reserved_tokens)
    if limits.max_total_num_tokens >= limits.context_length:
        assert budget_problems(limits, largest) == []
        assert budget_problems(limits, RequestBudget(128, largest.max_new_tokens + 1))


def test_generate_returns_a_well_formed_answer_with_spec_stats(server, prompt, tokenizer):
    status, body = call(server + "/generate", {"input_ids": prompt, "sampling_params": PARAMS, "rid": "proto-1"})
    assert status == 200, body
    eos = special_ids(tokenizer).eos_ids
    assert proto.check_generate_response(body, input_ids=prompt, sampling=PARAMS, eos_ids=eos) == []
    meta = body["meta_info"]
    assert meta["id"] == "proto-1" and meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["spec_verify_ct"] >= 1 and meta["completion_tokens"] <= 32
    assert "first_token_latency" in meta and "queue_time" in meta  # --enable-metrics: what dflash tune reads


def test_the_closed_sampling_schema_and_the_length_errors_with_the_draft_reserve(server, info, prompt):
    status, body = call(server + "/generate", {"input_ids": prompt, "sampling_params": {**PARAMS, "bogus": 1}})
    assert status == 400 and isinstance(body["error"], str) and "bogus" in body["error"]
    context = info["context_length"]
    reserve = capacity.reserved_tokens(info)
    # A prompt that fits by itself but not with the drafts' reserve is refused, the reserve counted in.
    too_long = [prompt[0]] * (context - reserve)
    status, body = call(server + "/generate", {"input_ids": too_long, "sampling_params": PARAMS})
    assert status == 400 and body["error"]["message"] == proto.msg_input_too_long(context, context)
    # prompt + max_new_tokens over the context: refused before it runs, and the client calls it context_length.
    params = proto.sampling_params(max_new_tokens=context)
    error = asyncio.run(_client_error(server, prompt, params))
    assert error.kind == sgl.CONTEXT_LENGTH and not error.retryable and "maximum context length" in error.message


async def _client_error(server: str, input_ids: list[int], params: dict) -> sgl.SGLangError:
    async with sgl.SGLangClient(server) as client:
        with pytest.raises(sgl.SGLangError) as caught:
            await client.generate(input_ids, params)
    return caught.value


def test_an_abort_by_rid_ends_the_request_with_its_partial_output(server, prompt):
    long = proto.sampling_params(max_new_tokens=4096, ignore_eos=True)
    outcome: dict = {}

    def run() -> None:
        outcome["response"] = call(server + "/generate", {"input_ids": prompt, "sampling_params": long, "rid": "ab-7"})

    thread = threading.Thread(target=run)
    thread.start()
    # Abort once the server runs it: an abort that arrives before the request is scheduled finds nothing to end.
    wait_until(lambda: _running_requests(server) >= 1, timeout_s=60, what="the request to be running")
    assert call(server + "/abort_request", {"rid": "ab-7", "abort_all": False})[0] == 200
    thread.join(timeout=120)
    status, body = outcome["response"]
    assert status == 200 and body["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(body["output_ids"]) < 4096
    assert call(server + "/flush_cache")[0] == 200  # idle again


def _running_requests(server: str) -> float:
    return proto.parse_metrics(call(server + "/metrics")[1])["sglang:num_running_reqs"]
