"""The simulator, over HTTP, against the protocol of ../shared/reference/sglang.md (checklist §9)."""

from __future__ import annotations

import concurrent.futures
import http.client
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson
import pytest

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.launch import SIM_VOCAB_FILE, free_ports, simulator_command
from dagster_project.tokenizer import special_ids
from tests.support.sglang_fixtures import SimFleet, call, wait_until

THINKING_PROMPT = [248045, 846, 198, 3838, 374, 220, 17, 10, 17, 30, 248046, 198, 248045, 74455, 198, 248068, 198]
NO_THINKING_PROMPT = [248045, 846, 198, 9419, 248046, 198, 248045, 74455, 198, 248068, 271, 248069, 271]
PARAMS = proto.sampling_params(max_new_tokens=4096)
SECRET = "sk-test-secret"
A, B, KEYED, NO_SPEC, SMALL, SLOW = range(6)
ROLES = [
    {"enable_metrics": True, "output_len": "uniform:40:120"},
    {"enable_metrics": True, "output_len": "uniform:40:120"},
    {"api_key": SECRET, "enable_metrics": True},
    {"speculative": False},
    {"context_length": 600, "output_len": "fixed:1000"},
    {
        "decode_step_s": 0.02,
        "max_running_requests": 10,
        "effective_max_running_requests": 2,
        "output_len": "fixed:200",
        "enable_metrics": True,
    },
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with SimFleet.start(len(ROLES), tmp_path_factory.mktemp("sims"), ROLES) as running:
        yield running


def generate(fleet: SimFleet, server: int, input_ids=THINKING_PROMPT, params=PARAMS, **extra: Any) -> tuple[int, Any]:
    return call(fleet.url(server) + "/generate", {"input_ids": input_ids, "sampling_params": params, **extra})


def used_tokens(fleet: SimFleet, server: int) -> float:
    return proto.parse_metrics(call(fleet.url(server) + "/metrics")[1])["sglang:num_used_tokens"]


def in_background(function, *args, **kwargs) -> concurrent.futures.Future:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(function, *args, **kwargs)
    pool.shutdown(wait=False)
    return future


# ---- responses ------------------------------------------------------------------------------------------------


def test_a_thinking_answer_is_real_token_ids_with_think_structure_and_exact_text(fleet, tokenizer):
    status, body = generate(fleet, A, rid="5f0c1e8a9b2d4c6e8f00112233445566", require_reasoning=True)
    assert status == 200
    special = special_ids(tokenizer)
    assert (
        proto.check_generate_response(body, input_ids=THINKING_PROMPT, sampling=PARAMS, eos_ids=special.eos_ids) == []
    )
    ids, meta = body["output_ids"], body["meta_info"]
    assert meta["id"] == "5f0c1e8a9b2d4c6e8f00112233445566"
    assert meta["finish_reason"] == {"type": "stop", "matched": special.turn_end} and ids[-1] == special.turn_end
    close = ids.index(special.think_end)
    assert ids[close - 1 : close + 2] == tokenizer.encode("\n</think>\n\n") and 0 < close < len(ids) - 3
    assert meta["reasoning_tokens"] == close + 1  # counted up to and including </think>
    assert max(ids) < special.vocab_size
    assert body["text"] == tokenizer.decode(ids[:-1], skip_special_tokens=False)  # stop token trimmed
    assert list(meta)[:5] == ["id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions"]
    assert meta["spec_verify_ct"] > 0 and meta["cached_tokens_details"] is None and meta["dp_rank"] is None


def test_answers_depend_only_on_seed_and_prompt(fleet):
    first, again, other_server = (generate(fleet, s)[1] for s in (A, A, B))
    assert first["output_ids"] == again["output_ids"] == other_server["output_ids"]
    other_prompt = generate(fleet, A, input_ids=THINKING_PROMPT[:-3] + [17, 248068, 198])[1]
    assert other_prompt["output_ids"] != first["output_ids"]
    assert first["meta_info"]["spec_verify_ct"] == again["meta_info"]["spec_verify_ct"]


def test_no_thinking_prompt_gets_an_answer_without_think_block(fleet, tokenizer):
    body = generate(fleet, A, input_ids=NO_THINKING_PROMPT)[1]
    assert special_ids(tokenizer).think_end not in body["output_ids"]
    assert body["meta_info"]["reasoning_tokens"] == 0  # not requested


def test_no_stop_trim_and_skip_special_tokens_shape_the_text(fleet, tokenizer):
    keep = proto.sampling_params(max_new_tokens=4096, no_stop_trim=True)
    body = generate(fleet, A, params=keep)[1]
    assert body["text"] == tokenizer.decode(body["output_ids"], skip_special_tokens=False)
    assert body["text"].endswith("<|im_end|>")
    skip = {**keep, "skip_special_tokens": True}
    assert not generate(fleet, A, params=skip)[1]["text"].endswith("<|im_end|>")


def test_length_stop_cuts_without_eos(fleet):
    body = generate(fleet, A, params=proto.sampling_params(max_new_tokens=7))[1]
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 7}
    assert len(body["output_ids"]) == 7 and proto.check_generate_response(body, sampling={"max_new_tokens": 7}) == []


def test_stop_token_ids_end_the_answer_on_that_token(fleet, tokenizer):
    think_end = special_ids(tokenizer).think_end
    body = generate(fleet, A, params=proto.sampling_params(max_new_tokens=4096, stop_token_ids=[think_end]))[1]
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": think_end}
    assert body["output_ids"][-1] == think_end and "</think>" not in body["text"]


def test_max_new_tokens_absent_means_128_and_null_means_up_to_the_context(fleet):
    assert generate(fleet, SMALL, params={})[1]["meta_info"]["finish_reason"] == {"type": "length", "length": 128}
    body = generate(fleet, SMALL, params={"max_new_tokens": None})[1]
    # max_req_len = context - 1 = 599, clipped to 599 - prompt - 1 (§1.2)
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 599 - len(THINKING_PROMPT) - 1}


def test_batch_input_gives_a_list_in_order_with_prefixed_rids(fleet):
    status, body = call(
        fleet.url(A) + "/generate",
        {"input_ids": [THINKING_PROMPT, NO_THINKING_PROMPT], "sampling_params": PARAMS, "rid": "batch"},
    )
    assert status == 200 and isinstance(body, list) and len(body) == 2
    assert [item["meta_info"]["id"] for item in body] == ["batch_0", "batch_1"]
    assert body[0]["output_ids"] == generate(fleet, A)[1]["output_ids"]


def test_prompt_token_ids_only_on_request(fleet):
    assert "prompt_token_ids" not in generate(fleet, A)[1]
    assert generate(fleet, A, return_prompt_token_ids=True)[1]["prompt_token_ids"] == THINKING_PROMPT


def test_a_server_without_spec_decoding_sends_no_spec_stats(fleet):
    body = generate(fleet, NO_SPEC)[1]
    assert not [key for key in body["meta_info"] if key.startswith("spec_")]
    assert proto.check_generate_response(body, spec_draft_tokens=None) == []
    assert call(fleet.url(NO_SPEC) + "/server_info")[1]["speculative_algorithm"] is None


# ---- errors ----------------------------------------------------------------------------------------------------


def test_request_errors_have_the_servers_shapes_and_texts(fleet):
    url = fleet.url(A) + "/generate"
    status, body = call(url, b'{"input_ids": [1, 2,')
    assert (
        status == 400
        and body["object"] == "error"
        and body["type"] == "Bad Request"
        and "JSON decode error" in body["message"]
    )
    status, body = call(url, {"text": 123})
    assert status == 400 and body["code"] == 400 and body["param"] is None  # E1
    assert call(url, {"input_ids": [1], "sampling_params": {"max_new_tokens": 10.0}}) == (
        400,
        {"error": "invalid type: floating point `10.0`, expected i64"},
    )
    assert call(url, {"input_ids": [1.5]}) == (400, {"error": "invalid type: floating point `1.5`, expected i32"})
    assert call(url, {"input_ids": []}) == (400, {"error": {"message": "input_ids cannot be empty."}})
    assert call(url, {"sampling_params": {}}) == (400, {"error": {"message": proto.MSG_NO_INPUT}})
    status, body = call(url, {"input_ids": [1], "sampling_params": {"top_p": 0}})
    assert (status, body["error"]["message"]) == (400, "top_p must be in (0, 1], got 0.0.")


def test_context_length_errors_are_verbatim(fleet):
    # Under NEXTN 3/1/4 the length checks count 4 more tokens per prompt: room for the drafts.
    url = fleet.url(SMALL) + "/generate"
    assert call(url, {"input_ids": [1] * 600})[1] == {"error": {"message": proto.msg_input_too_long(604, 600)}}
    assert call(url, {"input_ids": [1] * 100, "sampling_params": {"max_new_tokens": 501}})[1] == {
        "error": {"message": proto.msg_total_too_long(600, 104, 501)}
    }
    # Within the reserve of the limit: 96 + 501 fits 600, 96 + 4 + 501 does not.
    assert call(url, {"input_ids": [1] * 96, "sampling_params": {"max_new_tokens": 501}})[1] == {
        "error": {"message": proto.msg_total_too_long(600, 100, 501)}
    }
    assert call(url, {"input_ids": [1] * 96, "sampling_params": {"max_new_tokens": 500}})[0] == 200
    assert call(url, {"input_ids": [1] * 595, "sampling_params": {"max_new_tokens": 1}})[1] == {
        "error": {"message": proto.msg_input_exceeds_max(595, 594)}
    }


def test_api_key_guards_everything_but_health_and_metrics(fleet):
    base = fleet.url(KEYED)
    assert call(base + "/generate", {"input_ids": [1]}) == (401, {"error": "Unauthorized"})
    assert call(base + "/server_info")[0] == 401
    assert call(base + "/health")[0] == 200 and call(base + "/health_generate")[0] == 200
    assert call(base + "/metrics")[0] == 200
    bearer = {"Authorization": f"Bearer {SECRET}"}
    assert call(base + "/generate", {"input_ids": [1]}, headers=bearer)[0] == 200
    assert call(base + "/server_info", headers=bearer)[1]["api_key"] == SECRET  # unredacted, like SGLang (§3.3)


def test_duplicate_in_flight_rid_is_rejected(fleet):
    first = in_background(generate, fleet, SLOW, rid="dup-1")
    wait_until(lambda: fleet.state(SLOW)["running"] == 1, what="the first request to run")
    assert generate(fleet, SLOW, rid="dup-1") == (400, {"error": {"message": "Duplicate request ID detected: dup-1"}})
    call(fleet.url(SLOW) + "/abort_request", {"rid": "dup-1"})
    assert first.result()[1]["meta_info"]["finish_reason"]["type"] == "abort"


def test_abort_matches_the_exact_rid_only_and_returns_partial_answers(fleet):
    rids = ["job-1", "job-10", "other"]
    futures = {rid: in_background(generate, fleet, SLOW, rid=rid, input_ids=[5, 6, len(rid)]) for rid in rids}
    wait_until(
        lambda: fleet.state(SLOW)["running"] + fleet.state(SLOW)["queued"] == 3, what="three requests in the server"
    )
    wait_until(lambda: used_tokens(fleet, SLOW) > 20, what="some decoding")  # 2 running prompts hold 6 tokens
    assert call(fleet.url(SLOW) + "/abort_request", {"rid": "job-1"}) == (200, "")
    status, body = futures["job-1"].result(timeout=30)
    meta = body["meta_info"]
    assert status == 200 and meta["finish_reason"] == proto.finish_abort()
    assert len(body["output_ids"]) == meta["completion_tokens"] < 200
    assert proto.check_generate_response(body) == []
    # "job-1" is a prefix of "job-10", which SGLang 0.5.23 does not abort: it runs to its end.
    for rid in ("job-10", "other"):
        assert futures[rid].result(timeout=30)[1]["meta_info"]["finish_reason"]["type"] == "stop"


def test_running_cap_and_queue_are_observable_and_503_when_the_queue_is_full(fleet, sim_fleet):
    futures = [in_background(generate, fleet, SLOW, input_ids=[9, i]) for i in range(5)]
    wait_until(lambda: fleet.state(SLOW)["queued"] == 3, what="three queued requests")
    state = fleet.state(SLOW)
    assert (state["running"], state["cap"]) == (2, 2)
    metrics = proto.parse_metrics(call(fleet.url(SLOW) + "/metrics")[1])
    assert (metrics["sglang:num_running_reqs"], metrics["sglang:num_queue_reqs"]) == (2.0, 3.0)
    call(fleet.url(SLOW) + "/abort_request", {"rid": "", "abort_all": True})
    assert all(f.result(timeout=30)[1]["meta_info"]["finish_reason"]["type"] == "abort" for f in futures)

    bounded = sim_fleet(1, decode_step_s=0.05, max_running_requests=1, max_queued_requests=0, output_len="fixed:100")
    running = in_background(generate, bounded, 0)
    wait_until(lambda: bounded.state(0)["running"] == 1, what="one running request")
    assert generate(bounded, 0) == (503, proto.e4_body(503, "The request queue is full."))
    call(bounded.url(0) + "/abort_request", {"rid": "", "abort_all": True})
    running.result(timeout=30)


# ---- ops routes ------------------------------------------------------------------------------------------------


def test_server_info_reports_the_effective_cap_and_spec_state(fleet):
    info = call(fleet.url(SLOW) + "/server_info")[1]
    state = info["internal_states"][0]
    assert info["max_running_requests"] == 10 and state["effective_max_running_requests_per_dp"] == 2
    assert info["speculative_algorithm"] == state["speculative_algorithm"] == "EAGLE"
    assert info["speculative_num_draft_tokens"] == 4 and info["version"] == "0.5.23"
    assert (
        set(state["memory_usage"]) >= {"weight", "kvcache", "token_capacity", "graph"}
        and "last_gen_throughput" in state
    )
    assert call(fleet.url(A) + "/get_server_info")[1]["internal_states"][0]["avg_spec_accept_length"] > 1.0


def test_flush_cache_resets_spec_averages_and_refuses_while_busy(fleet):
    generate(fleet, B)
    assert "avg_spec_accept_length" in call(fleet.url(B) + "/server_info")[1]["internal_states"][0]
    assert call(fleet.url(B) + "/flush_cache", method="POST") == (200, proto.MSG_FLUSH_OK)
    assert "avg_spec_accept_length" not in call(fleet.url(B) + "/server_info")[1]["internal_states"][0]
    busy = in_background(generate, fleet, SLOW, rid="busy")
    wait_until(lambda: fleet.state(SLOW)["running"] == 1, what="a running request")
    assert call(fleet.url(SLOW) + "/flush_cache") == (400, "Flush cache failed.\n")
    call(fleet.url(SLOW) + "/abort_request", {"rid": "busy"})
    busy.result(timeout=30)


def test_metrics_use_sglang_names_and_labels_and_404_when_disabled(fleet):
    assert call(fleet.url(NO_SPEC) + "/metrics")[0] == 404
    generate(fleet, A)
    text = call(fleet.url(A) + "/metrics")[1]
    labels = 'engine_type="unified",model_name="Qwen/Qwen3.6-27B",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    assert (
        "# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\n" in text
    )
    assert f"sglang:num_running_reqs{{{labels}}} 0.0" in text
    assert "# TYPE sglang:generation_tokens_total counter" in text and "_created" not in text
    assert (
        'sglang:e2e_request_latency_seconds_bucket{engine_type="unified",is_streaming="false",le="+Inf",model_name="Qwen/Qwen3.6-27B"}'
        in text
    )
    metrics = proto.parse_metrics(text)
    assert metrics["sglang:generation_tokens_total"] > 0 and metrics["sglang:spec_accept_length"] > 1.0


def test_model_routes(fleet):
    assert call(fleet.url(A) + "/v1/models")[1]["data"][0] | {"created": 0} == {
        "id": "Qwen/Qwen3.6-27B", "object": "model", "created": 0, "owned_by": "sglang",
        "root": "Qwen/Qwen3.6-27B", "parent": None, "max_model_len": 65536,
    }  # fmt: skip
    info = call(fleet.url(A) + "/model_info")[1]
    assert info["architectures"] == ["Qwen3_5ForConditionalGeneration"] and info["reasoning_parser"] == "qwen3"
    assert (info["model_path"], info["model_type"], info["has_image_understanding"]) == (
        "Qwen/Qwen3.6-27B",
        "qwen3_5",
        True,
    )
    assert call(fleet.url(A) + "/get_model_info")[1] == info
    assert call(fleet.url(A) + "/ready")[0] == 200


def test_health_is_503_while_starting(fleet):
    port = free_ports(1)[0]
    vocab = fleet.fleet.run_dir / SIM_VOCAB_FILE
    command = simulator_command(port, {"startup_s": 60}, vocab_file=vocab, host="127.0.0.1")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(url + "/health"), what="the HTTP server to listen")
        assert call(url + "/health")[0] == call(url + "/health_generate")[0] == call(url + "/ready")[0] == 503
    finally:
        process.kill()
        process.wait()


def _answers(url: str) -> bool:
    try:
        call(url, timeout=1)
    except OSError:
        return False
    return True


def test_request_log_records_rids_and_prompt_hashes(fleet):
    since = len(fleet.requests(B))
    generate(fleet, B, rid="logged-1", input_ids=[7, 8, 9])
    (entry,) = fleet.requests(B, since=since)
    assert entry["rid"] == "logged-1" and entry["input_hash"] == proto.input_hash([7, 8, 9])
    assert (entry["prompt_tokens"], entry["outcome"]) == (3, "stop")


def test_a_client_that_disconnects_frees_its_slot(fleet):
    since = len(fleet.requests(SLOW))
    fleet.set_faults(SLOW, hang=True)  # no answer comes: the client leaves mid-answer, however slow the machine
    try:
        client = http.client.HTTPConnection(urllib.parse.urlsplit(fleet.url(SLOW)).netloc, timeout=30)
        body = orjson.dumps({"input_ids": [4, 4], "rid": "gone"})
        client.request("POST", "/generate", body, {"Content-Type": "application/json"})
        wait_until(lambda: fleet.state(SLOW)["running"] == 1, what="the request to run")
        client.close()
        wait_until(
            lambda: fleet.requests(SLOW, since=since)[0]["outcome"] == "disconnected", what="the server to abort it"
        )
    finally:
        fleet.clear_faults(SLOW)
    assert fleet.state(SLOW)["running"] == 0


# ---- faults ------------------------------------------------------------------------------------------------


def test_fault_empty_truncate_and_mtp_off(sim_fleet):
    sims = sim_fleet(1, output_len="fixed:90")
    eos = 248046
    sims.set_faults(0, empty=1)
    assert generate(sims, 0)[1]["output_ids"] == [eos]
    sims.set_faults(0, truncate=1)
    body = generate(sims, 0)[1]
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 30} and len(body["output_ids"]) == 30
    sims.set_faults(0, mtp_off=True)
    meta = generate(sims, 0)[1]["meta_info"]
    assert meta["spec_verify_ct"] == meta["completion_tokens"] == 90 and meta["spec_accept_length"] == 1.0
    assert meta["spec_correct_drafts_histogram"] == [90] and meta["spec_accept_rate"] == 0.0
    sims.clear_faults(0)
    assert generate(sims, 0)[1]["meta_info"]["spec_accept_length"] > 1.5


def test_fault_503_burst_then_recovery(sim_fleet):
    sims = sim_fleet(1)
    sims.set_faults(0, error_503=2)
    assert [generate(sims, 0)[0] for _ in range(3)] == [503, 503, 200]
    sims.set_faults(0, error_503_for_s=60)
    assert generate(sims, 0)[0] == 503
    sims.clear_faults(0)
    assert generate(sims, 0)[0] == 200


def test_fault_hang_stops_progress_and_fails_health_after_the_health_timeout(sim_fleet):
    # As SGLang: /health and /health_generate inject a 1-token generation; none within the timeout is a 503.
    sims = sim_fleet(1, decode_step_s=0.001, health_check_timeout_s=0.5)
    sims.set_faults(0, hang=True)
    pending = in_background(generate, sims, 0)
    wait_until(lambda: sims.state(0)["running"] == 1, what="a running request")
    assert call(sims.url(0) + "/health")[0] == 503 and call(sims.url(0) + "/health_generate")[0] == 503
    assert not pending.done() and sims.state(0)["counters"]["requests"] == 0
    sims.set_faults(0, hang=False)
    assert pending.result(timeout=10)[0] == 200
    assert call(sims.url(0) + "/health_generate")[0] == 200


def test_fault_nan_ends_the_answer_with_sglangs_nan_stop(sim_fleet, tokenizer):
    eos = special_ids(tokenizer).turn_end
    sims = sim_fleet(1, output_len="fixed:40")
    sims.set_faults(0, nan=1)
    status, body = generate(sims, 0)
    assert status == 200 and body["meta_info"]["finish_reason"] == {"type": "stop", "matched": "NaN happened"}
    assert body["output_ids"][-1] == eos and len(body["output_ids"]) == body["meta_info"]["completion_tokens"]
    assert generate(sims, 0)[1]["meta_info"]["finish_reason"]["matched"] == eos  # one request only


def test_fault_drop_closes_the_connection_without_a_status(sim_fleet):
    sims = sim_fleet(1)
    sims.set_faults(0, drop=1)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(
            urllib.request.Request(sims.url(0) + "/generate", data=orjson.dumps({"input_ids": [1]})), timeout=10
        )
    assert sims.alive(0) and generate(sims, 0)[0] == 200
    assert [e["outcome"] for e in sims.requests(0)] == ["dropped", "stop"]


def test_fault_crash_drops_in_flight_requests_and_exits(sim_fleet):
    sims = sim_fleet(1, decode_step_s=0.01, output_len="fixed:300")
    in_flight = in_background(generate, sims, 0)
    wait_until(lambda: sims.state(0)["running"] == 1, what="a running request")
    sims.set_faults(0, crash_after_requests=1)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        generate(sims, 0)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        in_flight.result(timeout=10)
    wait_until(lambda: not sims.alive(0), what="the process to exit")


# ---- streaming -------------------------------------------------------------------------------------------------


def stream_events(fleet: SimFleet, server: int, body: dict) -> tuple[str, list]:
    request = urllib.request.Request(fleet.url(server) + "/generate", data=orjson.dumps({**body, "stream": True}))
    with urllib.request.urlopen(request, timeout=30) as response:
        content_type, raw = response.headers["Content-Type"], response.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = [line[len("data: ") :] for line in raw.split("\n\n") if line]
    return content_type, [orjson.loads(e) for e in events[:-1]] + [events[-1]]


def test_streaming_is_cumulative_and_ends_with_done(fleet):
    content_type, events = stream_events(fleet, SLOW, {"input_ids": THINKING_PROMPT, "sampling_params": PARAMS})
    *chunks, final, done = events
    assert content_type.startswith("text/event-stream") and done == "[DONE]" and len(chunks) == 4
    assert (
        all(c["meta_info"]["finish_reason"] is None for c in chunks)
        and final["meta_info"]["finish_reason"]["type"] == "stop"
    )
    assert (
        "response_sent_to_client_ts" in chunks[0]["meta_info"]
        and "response_sent_to_client_ts" not in final["meta_info"]
    )
    lengths = [len(c["output_ids"]) for c in chunks]
    assert lengths == sorted(lengths) and lengths[0] == 1 and lengths[-1] < 200
    for chunk in chunks:
        assert final["output_ids"][: len(chunk["output_ids"])] == chunk["output_ids"]
        assert "spec_verify_ct" not in chunk["meta_info"] and "e2e_latency" not in chunk["meta_info"]
    assert proto.check_generate_response(final, input_ids=THINKING_PROMPT) == []


def test_streaming_errors_arrive_as_a_chunk(fleet):
    _, events = stream_events(fleet, SMALL, {"input_ids": [1] * 600})
    assert events == [
        {
            "error": {
                "message": proto.msg_input_too_long(604, 600),
                "type": "invalid_request_error",
                "code": 400,
                "retryable": False,
            }
        },
        "[DONE]",
    ]


# ---- capacity: the memory model, KV-budget admission, batch-size effects ----------------------------------------

# A typical H200 launch with --max-running-requests unset (tests/unit/sglang/test_capacity.py derives these numbers):
# 0.5.23 gives it 22 running requests.
H200 = {"gpu_memory_gb": 139.4, "weights_gb": 52.31, "mem_fraction_static": 0.824, "max_running_requests": None}
# A server whose KV pool, 20,320 tokens, binds long before its cap of 16 (radix cache off: 16 state slots).
SMALL_POOL = {
    "gpu_memory_gb": 74.9,
    "mem_fraction_static": 0.88,
    "disable_radix_cache": True,
    "max_running_requests": 16,
}


def test_the_memory_model_sizes_pools_and_cap_as_0_5_23_and_server_info_says_so(sim_fleet):
    from dagster_project.sglang import capacity

    fleet = sim_fleet(3, [H200, {**H200, "disable_radix_cache": True, "max_running_requests": 64}, {}])
    info = call(fleet.url(0) + "/server_info")[1]
    state = info["internal_states"][0]
    assert (info["max_running_requests"], state["effective_max_running_requests_per_dp"]) == (48, 22)
    assert (state["max_mamba_cache_size"], info["max_total_num_tokens"]) == (111, 512_108)
    assert state["memory_usage"]["kvcache"] == round(512_108 * 69_632 / capacity.GIB, 3)
    report = capacity.analyze(info, prompt_tokens=600, output_tokens=2000)
    assert (report.cap, report.bound, report.best.flags) == (
        22,
        capacity.Resource.MAMBA_SLOTS,
        ("--disable-radix-cache", "--max-running-requests", "69"),
    )
    assert fleet.state(0)["cap"] == 22
    radix_off = call(fleet.url(1) + "/server_info")[1]
    assert radix_off["internal_states"][0]["effective_max_running_requests_per_dp"] == 64
    assert capacity.analyze(radix_off, 600, 2000).cap_bound is capacity.Resource.CONFIGURED
    # Without the memory model the pools are as given, and still read as a consistent server.
    given = capacity.analyze(call(fleet.url(2) + "/server_info")[1], 600, 2000)
    assert (given.cap, given.limits[capacity.Resource.MAMBA_SLOTS]) == (8, 8)
    # A launch the memory cannot hold does not start, like the real server.
    bad = subprocess.run(
        [*simulator_command(free_ports(1)[0], {**H200, "disable_radix_cache": True, "max_running_requests": 96},
                            vocab_file=None, host="127.0.0.1")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "leaves no KV tokens" in bad.stderr


def test_kv_budget_admission_keeps_early_batches_below_the_cap(sim_fleet):
    fleet = sim_fleet(1, {**SMALL_POOL, "decode_step_s": 0.01, "output_len": "fixed:3000", "enable_metrics": True})
    params = proto.sampling_params(max_new_tokens=4096)
    futures = [in_background(generate, fleet, 0, input_ids=[7, i] + [1] * 98, params=params) for i in range(10)]
    wait_until(lambda: fleet.state(0)["running"] + fleet.state(0)["queued"] == 10, what="ten requests in the server")
    # Each needs 100 + 4096 + 1 tokens free besides what every running one holds and may still write at the
    # starting new_token_ratio 0.7: 100 + 0.7 × 4096 = 2,967; 20,320 − 5 × 2,967 = 5,484 fits a sixth, not a seventh.
    state = fleet.state(0)
    assert (state["running"], state["queued"], state["cap"]) == (6, 4, 16)
    metrics = proto.parse_metrics(call(fleet.url(0) + "/metrics")[1])
    assert 0.6 < metrics["sglang:new_token_ratio"] <= 0.7 and metrics["sglang:max_total_num_tokens"] == 20_320
    call(fleet.url(0) + "/abort_request", {"rid": "", "abort_all": True})
    assert all(f.result(timeout=30)[1]["meta_info"]["finish_reason"]["type"] == "abort" for f in futures)


def test_the_ratio_decays_admits_more_and_a_full_pool_retracts(sim_fleet):
    fleet = sim_fleet(1, {**SMALL_POOL, "decode_step_s": 0.0005, "output_len": "fixed:3000", "enable_metrics": True})
    params = proto.sampling_params(max_new_tokens=4096)
    futures = [in_background(generate, fleet, 0, input_ids=[8, i] + [1] * 98, params=params) for i in range(12)]
    bodies = [f.result(timeout=120)[1] for f in futures]
    assert all(body["meta_info"]["finish_reason"]["type"] == "stop" for body in bodies)
    assert fleet.state(0)["peaks"]["running"] > 6  # the decayed ratio let more in than the first batch
    retracted = proto.parse_metrics(call(fleet.url(0) + "/metrics")[1])["sglang:num_retracted_requests_total"]
    assert retracted >= 1 and sum(body["meta_info"]["num_retractions"] for body in bodies) == retracted
