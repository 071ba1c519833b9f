"""One conformance suite, two servers: every protocol behaviour the project relies on, asserted by the same test
against the real SGLang 0.5.23 (on the CPU, a tiny random-weight dense model) and against the simulator launched
as its twin (`server` is parametrized over both, conftest.py).

What the project reads or sends, and where: the client's request and error kinds (`sglang/client.py`), the
response contract (`sglang/protocol.py`), the dispatcher's window and abort (`generation/dispatch.py`,
`server_checks.py`), the watchdog's load reads (`server_watch.py`), the capacity model and the startup check
(`sglang/capacity.py`, `generation/preflight.py`), the metrics exporter and the Grafana board (`ops/metrics.py`,
`deploy/grafana/`). What the CPU cannot run (speculative decoding: EAGLE needs AMX or a GPU) is a simulator-only
parameter with its reason, reported as skipped, never as passed.

Random weights never stop by themselves on purpose: answers end on their length, or on a stop id taken from a
first greedy answer. The test that sends an id outside the vocabulary kills the server, so it runs last.
"""

from __future__ import annotations

import asyncio
import http.client
import urllib.error
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from dagster_project.generation.preflight import ServerLimits
from dagster_project.sglang import capacity
from dagster_project.sglang import client as sgl
from dagster_project.sglang import protocol as proto
from dagster_project.tokenizer import render_prompt_ids, special_ids
from tests.sglang_real.conftest import Server
from tests.support.sglang_fixtures import call, wait_until

GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
# Long enough to be caught running on the slower server (the real one decodes ~30 tokens/s on the CPU).
LONG = {"max_new_tokens": 3000, "temperature": 0.0, "ignore_eos": True}
RUNNING_TIMEOUT_S = 120.0
# meta_info of a finished answer from a server launched with --enable-metrics and no speculative decoding.
META_KEYS = {
    "id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "storage_prefetch_wait",
    "storage_staging_wait", "forward_entry_time",
    "prefill_finished_time", "queue_time", "reasoning_tokens", "completion_tokens", "cached_tokens",
    "weight_versions", "cached_tokens_details", "dp_rank", "e2e_latency", "request_received_ts",
    "first_token_latency", "api_server_dispatch_finish_ts", "request_finished_ts", "decode_throughput",
    "response_sent_to_client_ts",
}  # fmt: skip
SIM_ONLY_SPEC = pytest.param(
    "real",
    marks=(
        pytest.mark.gpu_only,
        pytest.mark.skip(
            reason="simulator-only: speculative decoding does not run on a CPU without AMX (0.5.23 stops EAGLE on "
            "torch_native attention); checked on a GPU node by scripts/gpu_check.sh"
        ),
    ),
)
_pool = ThreadPoolExecutor(max_workers=8)


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return render_prompt_ids(tokenizer, [{"role": "user", "content": "What is 2 + 2? Answer briefly."}])


def generate(server: Server, input_ids: Any, params: dict, rid: Any = None, **extra: Any) -> tuple[int, Any]:
    body = {"input_ids": input_ids, "sampling_params": params, **extra}
    if rid is not None:
        body["rid"] = rid
    return call(server.url + "/generate", body, timeout=600)


def conforms(body: Any, prompt: list[int], params: dict, tokenizer: Any) -> bool:
    """The response contract of a server without speculative decoding holds (`protocol.check_generate_response`)."""
    eos = special_ids(tokenizer).eos_ids
    problems = proto.check_generate_response(
        body, input_ids=prompt, sampling=params, spec_draft_tokens=None, eos_ids=eos
    )
    assert problems == [], problems
    return True


def in_background(server: Server, input_ids: list[int], params: dict, rid: str) -> Future:
    return _pool.submit(generate, server, input_ids, params, rid)


def metrics(server: Server) -> dict[str, float]:
    status, text = call(server.url + "/metrics")
    assert status == 200
    return proto.parse_metrics(text)


def wait_running(server: Server, count: int = 1) -> None:
    """Until the server's own gauge reports `count` requests running (an abort before that finds none)."""
    wait_until(
        lambda: metrics(server).get(proto.RUNNING_REQS, 0) >= count,
        timeout_s=RUNNING_TIMEOUT_S,
        interval_s=0.2,
        what=f"{count} request(s) running on the {server.kind} server",
    )


def abort(server: Server, rid: str = "", abort_all: bool = False) -> tuple[int, Any]:
    return call(server.url + "/abort_request", {"rid": rid, "abort_all": abort_all})


# ---- health and ops routes -------------------------------------------------------------------------------------


def test_health_and_health_generate_answer_200(server):
    assert call(server.url + "/health")[0] == 200
    assert call(server.url + "/health_generate")[0] == 200


def test_server_info_has_the_fields_the_capacity_model_and_the_startup_check_read(server):
    status, info = call(server.url + "/server_info")
    assert status == 200
    assert info["version"] == "0.5.23"
    assert info["context_length"] == 4096  # passed with --context-length (null without it on the real server)
    assert info["speculative_algorithm"] is None
    assert info["reasoning_parser"] == "qwen3"  # `launch.server_command` passes it
    assert isinstance(info["max_total_num_tokens"], int) and isinstance(info["max_req_input_len"], int)
    assert isinstance(info["startup_time"], dict)  # phases (load_weight, ...), not a number
    state = info["internal_states"][0]
    assert isinstance(state["effective_max_running_requests_per_dp"], int)
    assert state["effective_max_running_requests_per_dp"] >= 1
    # What reads /server_info copes with what the real one gives (nulls included).
    limits = ServerLimits.from_server_info(info)
    assert limits.context_length == 4096 and limits.reserved_tokens == 0
    assert capacity.reserved_tokens(info) == 0
    report = capacity.analyze(info, 600, 2000)
    assert report.cap == state["effective_max_running_requests_per_dp"]


def test_model_info_reports_the_served_model(server):
    """What the served-model check reads: the simulator declares the model it serves as the real server does."""
    status, body = call(server.url + "/model_info")
    assert status == 200
    assert body["model_type"] == "qwen3" and body["architectures"] == ["Qwen3ForCausalLM"]
    assert body["is_generation"] is True and body["has_image_understanding"] is False
    assert body["model_path"] == body["tokenizer_path"]


# ---- /generate -------------------------------------------------------------------------------------------------


def test_an_answer_has_the_fields_and_types_the_client_reads(server, prompt, tokenizer):
    status, body = generate(server, prompt, GREEDY, rid="conf-fields")
    assert status == 200, body
    assert conforms(body, prompt, GREEDY, tokenizer)
    meta = body["meta_info"]
    assert set(meta) == META_KEYS
    assert meta["id"] == "conf-fields" and meta["finish_reason"] == proto.finish_length(8)
    assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == len(body["output_ids"]) == 8
    assert all(isinstance(token, int) for token in body["output_ids"])
    for key in ("num_retractions", "reasoning_tokens", "cached_tokens"):
        assert isinstance(meta[key], int), key
    for key in ("e2e_latency", "queue_time", "first_token_latency", "response_sent_to_client_ts"):
        assert isinstance(meta[key], float), key
    assert meta["weight_version"] == "default" and meta["dp_rank"] is None
    # The client turns it into a result: what the dispatcher stores.
    result = asyncio.run(_client_generate(server, prompt, GREEDY))
    assert result.finish_type == "length" and result.completion_tokens == 8 and result.truncated


async def _client_generate(server: Server, input_ids: list[int], params: dict) -> sgl.GenerateResult:
    async with sgl.SGLangClient(server.url) as client:
        return await client.generate(input_ids, params)


def test_a_repeated_prompt_is_served_from_the_prefix_cache(server, prompt):
    generate(server, prompt, GREEDY)
    status, body = generate(server, prompt, GREEDY)
    meta = body["meta_info"]
    assert status == 200 and 0 < meta["cached_tokens"] < len(prompt)
    assert meta["cached_tokens_details"] == {"device": meta["cached_tokens"], "host": 0}


def test_a_stop_token_ends_the_answer_on_it_unless_eos_is_ignored(server, prompt, tokenizer):
    params = {"max_new_tokens": 8, "temperature": 0.0}
    status, first = generate(server, prompt, params)
    assert status == 200 and first["meta_info"]["finish_reason"] == proto.finish_length(8)
    stop = first["output_ids"][3]
    stopping = {**params, "stop_token_ids": [stop]}
    status, body = generate(server, prompt, stopping)
    assert status == 200 and body["meta_info"]["finish_reason"] == proto.finish_stop(stop)
    assert body["output_ids"] == first["output_ids"][: first["output_ids"].index(stop) + 1]
    assert conforms(body, prompt, stopping, tokenizer)
    status, body = generate(server, prompt, {**stopping, "ignore_eos": True})
    assert status == 200 and body["meta_info"]["finish_reason"] == proto.finish_length(8)


def test_a_batch_answers_a_list_in_input_order(server, prompt):
    prompts = [prompt, prompt[:-3], prompt[:5]]
    status, body = generate(server, prompts, GREEDY, rid=["batch-a", "batch-b", "batch-c"])
    assert status == 200 and isinstance(body, list) and len(body) == 3
    assert [answer["meta_info"]["id"] for answer in body] == ["batch-a", "batch-b", "batch-c"]
    assert [answer["meta_info"]["prompt_tokens"] for answer in body] == [len(p) for p in prompts]


def test_without_max_new_tokens_an_answer_is_capped_at_128(server, prompt):
    status, body = generate(server, prompt, {"temperature": 0.0, "ignore_eos": True})
    assert status == 200 and body["meta_info"]["finish_reason"] == proto.finish_length(128)


# ---- errors ------------------------------------------------------------------------------------------------------


def test_refusals_have_the_shapes_the_client_classifies(server, prompt):
    status, body = generate(server, prompt, {**GREEDY, "bogus": 1})
    assert status == 400 and isinstance(body["error"], str) and "unknown field `bogus`" in body["error"]
    assert generate(server, prompt, {"max_new_tokens": 10.0}) == (
        400,
        {"error": "invalid type: floating point `10.0`, expected i64"},
    )
    assert generate(server, [], GREEDY) == (400, {"error": {"message": proto.MSG_EMPTY_INPUT_IDS}})
    error = sgl.classify_http_error(*generate(server, prompt, {**GREEDY, "bogus": 1}))
    assert error.kind == sgl.BAD_REQUEST and not error.retryable


def test_the_context_limit_is_refused_before_it_runs(server, prompt):
    too_long = [prompt[0]] * 4096
    assert generate(server, too_long, GREEDY) == (400, {"error": {"message": proto.msg_input_too_long(4096, 4096)}})
    status, body = generate(server, prompt, {**GREEDY, "max_new_tokens": 4096})
    assert status == 400
    assert body == {"error": {"message": proto.msg_total_too_long(4096, len(prompt), 4096)}}
    error = sgl.classify_http_error(status, body)
    assert error.kind == sgl.CONTEXT_LENGTH and not error.retryable


def test_a_duplicate_rid_in_flight_is_refused(server, prompt):
    running = in_background(server, prompt, LONG, "conf-dup")
    wait_running(server)
    assert generate(server, prompt, GREEDY, rid="conf-dup") == (
        400,
        {"error": {"message": proto.msg_duplicate_rid("conf-dup")}},
    )
    assert sgl.classify_http_error(400, {"error": {"message": proto.msg_duplicate_rid("x")}}).kind == sgl.DUPLICATE_RID
    assert abort(server, "conf-dup") == (200, "")
    assert running.result(timeout=120)[1]["meta_info"]["finish_reason"]["type"] == "abort"


# ---- aborts ------------------------------------------------------------------------------------------------------


def test_an_abort_by_the_full_rid_ends_the_request_with_its_partial_output(server, prompt):
    running = in_background(server, prompt, LONG, "conf-abort-1")
    wait_running(server)
    assert abort(server, "conf-abort-1") == (200, "")
    status, body = running.result(timeout=120)
    assert status == 200 and body["meta_info"]["finish_reason"] == proto.finish_abort()
    assert len(body["output_ids"]) == body["meta_info"]["completion_tokens"] < LONG["max_new_tokens"]
    assert metrics(server)["sglang:num_aborted_requests_total"] >= 1  # exists once a request was aborted


def test_an_abort_by_an_rid_prefix_or_an_unknown_rid_aborts_nothing(server, prompt):
    params = {**LONG, "max_new_tokens": 200}
    running = in_background(server, prompt, params, "conf-prefix-0123456789")
    wait_running(server)
    assert abort(server, "conf-prefix") == (200, "")  # a prefix of the rid: not that rid
    assert abort(server, "no-such-rid") == (200, "")
    status, body = running.result(timeout=300)
    assert status == 200 and body["meta_info"]["finish_reason"] == proto.finish_length(200)


def test_abort_all_ends_every_request(server, prompt):
    futures = [in_background(server, prompt[: 10 + i], LONG, f"conf-all-{i}") for i in range(3)]
    wait_running(server, 3)
    assert abort(server, abort_all=True) == (200, "")
    for future in futures:
        assert future.result(timeout=120)[1]["meta_info"]["finish_reason"]["type"] == "abort"


# ---- /metrics ----------------------------------------------------------------------------------------------------

# Families the project reads (protocol, launch's probes, the watchdog, the Grafana board), with their labels.
READ_FAMILIES = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:full_token_usage": "gauge",
    "sglang:mamba_usage": "gauge",
    "sglang:gen_throughput": "gauge",
    "sglang:spec_accept_length": "gauge",
    "sglang:spec_accept_rate": "gauge",
    "sglang:generation_tokens": "counter",
    "sglang:num_requests": "counter",
    "sglang:prompt_tokens": "counter",
    "sglang:e2e_request_latency_seconds": "histogram",
}


def test_metrics_have_the_families_and_labels_the_project_reads(server, prompt):
    from prometheus_client.parser import text_string_to_metric_families

    generate(server, prompt, GREEDY)
    text = call(server.url + "/metrics")[1]
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name, kind in READ_FAMILIES.items():
        assert name in families, name
        assert families[name].type == kind, name
    labels = {frozenset(sample.labels) for sample in families["sglang:num_running_reqs"].samples}
    assert all({"model_name", "engine_type", "tp_rank", "pp_rank"} <= label for label in labels), labels
    assert {frozenset(s.labels) - {"le"} for s in families["sglang:e2e_request_latency_seconds"].samples} == {
        frozenset({"model_name", "engine_type", "is_streaming"})
    }
    parsed = proto.parse_metrics(text)
    assert parsed["sglang:generation_tokens_total"] > 0 and proto.reported_load(parsed) is not None


# ---- speculative decoding: the simulator alone -------------------------------------------------------------------


@pytest.mark.parametrize("kind", [SIM_ONLY_SPEC, "sim"])
def test_spec_stats_obey_their_invariants(kind, tmp_path_factory, prompt):
    from tests.support.sglang_fixtures import SimFleet

    with SimFleet.start(1, tmp_path_factory.mktemp("spec"), {"enable_metrics": True}) as fleet:
        status, body = call(fleet.url(0) + "/generate", {"input_ids": prompt, "sampling_params": GREEDY})
    meta = body["meta_info"]
    assert status == 200 and meta["spec_verify_ct"] >= 1
    assert proto.check_spec_stats(meta) == []


# ---- last: what kills the real server ----------------------------------------------------------------------------


def test_zz_an_input_id_outside_the_vocabulary_kills_the_server(server):
    """0.5.23 raises IndexError in the embedding: the connection closes without an HTTP status and the whole server
    dies. The simulator does the same, so nothing may be learned from it that the real one would not survive."""
    with pytest.raises(ConnectionError):
        call_raw(server.url + "/generate", {"input_ids": [1, 248320], "sampling_params": GREEDY})
    wait_until(lambda: not _answers(server.url + "/health"), timeout_s=120, interval_s=0.5, what="the server to die")


def call_raw(url: str, body: dict) -> None:
    """`call`, with a dropped connection raised as ConnectionError (urllib wraps it in URLError or not)."""
    try:
        call(url, body, timeout=120)
    except (http.client.RemoteDisconnected, ConnectionResetError, urllib.error.URLError) as exc:
        raise ConnectionError(str(exc)) from exc


def _answers(url: str) -> bool:
    try:
        return call(url, timeout=5)[0] == 200
    except (OSError, http.client.HTTPException):
        return False
