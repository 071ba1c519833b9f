"""The shared protocol rules (reference §1-§4) and the client's error classification, without a server."""

from __future__ import annotations

import pickle

import orjson
import pytest

from dagster_project.sglang import client
from dagster_project.sglang import protocol as proto
from tests.support.paths import require_shared

# The literal §1.6 example response (output_ids shortened there; here they are as long as claimed).
REFERENCE_META = {
    "id": "5f0c1e8a9b2d4c6e8f00112233445566",
    "finish_reason": {"type": "stop", "matched": 248046},
    "prompt_tokens": 17,
    "weight_version": "default",
    "num_retractions": 0,
    "reasoning_tokens": 942,
    "completion_tokens": 993,
    "cached_tokens": 0,
    "weight_versions": [{"version": "default", "start": 0, "end": 993}],
    "cached_tokens_details": None,
    "dp_rank": None,
    "e2e_latency": 21.4377,
    "spec_accept_rate": 634 / 1074,
    "spec_accept_length": 993 / 358,
    "spec_num_correct_drafts": 634,
    "spec_num_proposed_drafts": 1074,
    "spec_verify_ct": 358,
    "spec_correct_drafts_histogram": [80, 70, 60, 148],
    "response_sent_to_client_ts": 1764510212.846,
}


def reference_response() -> dict:
    return {"text": "...", "output_ids": [760] * 992 + [248046], "meta_info": dict(REFERENCE_META)}


def test_sampling_params_are_all_explicit_and_typed_like_the_contract():
    params = proto.sampling_params(max_new_tokens=32768, temperature=1, top_p=0.95)
    assert list(params) == list(proto.EXPLICIT_SAMPLING_KEYS)
    assert params["temperature"] == 1.0 and isinstance(params["temperature"], float)
    assert params["skip_special_tokens"] is False and params["no_stop_trim"] is False
    assert orjson.loads(orjson.dumps(params)) == params
    assert proto.sampling_params(max_new_tokens=8, stop_token_ids=[248069])["stop_token_ids"] == [248069]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_new_tokens": 10.0}, "invalid type: floating point `10.0`, expected i64"),
        ({"temperature": "0.6"}, 'invalid type: string "0.6", expected f64'),
        ({"top_k": True}, "invalid type: boolean `true`, expected i64"),
        ({"skip_special_tokens": 0}, "invalid type: integer `0`, expected a boolean"),
        ({"stop": [1]}, "invalid type: integer `1`, expected a string"),
        ({"stop_token_ids": "x"}, 'invalid type: string "x", expected a sequence'),
    ],
)
def test_contract_errors_use_the_servers_serde_wording(params, message):
    with pytest.raises(proto.ContractError) as caught:
        proto.check_sampling_contract(params)
    assert str(caught.value) == message


def test_unknown_sampling_key_lists_the_whole_closed_schema():
    with pytest.raises(proto.ContractError) as caught:
        proto.check_sampling_contract({"foo": 1})
    message = str(caught.value)
    assert message.startswith("unknown field `foo`, expected one of `max_new_tokens`, `stop`, ")
    assert message.endswith("`watermark`, `choice`") and len(proto.SAMPLING_KEYS) == 28


def test_null_means_default_for_every_key():
    proto.check_sampling_contract({key: None for key in proto.SAMPLING_KEYS})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3.0."),
        ({"max_new_tokens": 4, "min_new_tokens": 5}, "min_new_tokens must be in [0, max_new_tokens(4)], got 5."),
    ],
)
def test_value_errors_match_the_server(params, message):
    with pytest.raises(ValueError) as caught:
        proto.check_sampling_values(params, vocab_size=248320)
    assert str(caught.value) == message


def test_greedy_and_disabled_top_k_are_valid():
    proto.check_sampling_values({"temperature": 0.0, "top_k": 0}, vocab_size=10)  # greedy forces top_k=1
    proto.check_sampling_values({"top_k": -1}, vocab_size=10)


def test_the_reference_example_satisfies_every_invariant():
    assert proto.check_generate_response(reference_response(), input_ids=[0] * 17, eos_ids=[248046, 248044]) == []


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"spec_verify_ct": 357}, "sum(histogram)"),
        ({"spec_num_proposed_drafts": 1000}, "spec_num_proposed_drafts"),
        ({"spec_accept_length": 2.77}, "spec_accept_length"),
        ({"spec_correct_drafts_histogram": [80, 70, 60, 148, 0]}, "len(histogram)"),
        ({"completion_tokens": 992}, "completion_tokens=992 != len(output_ids)"),
        ({"finish_reason": {"type": "stop", "matched": 5}}, "do not end with it"),
    ],
)
def test_broken_invariants_are_reported(change, complaint):
    response = reference_response()
    response["meta_info"].update(change)
    problems = proto.check_generate_response(response)
    assert any(complaint in problem for problem in problems), problems


def test_key_order_and_spec_keys_on_a_server_without_spec_are_reported():
    response = reference_response()
    meta = response["meta_info"]
    response["meta_info"] = {"prompt_tokens": meta.pop("prompt_tokens"), **meta}
    assert any("key order" in p for p in proto.check_generate_response(response))
    assert any("without spec" in p for p in proto.check_generate_response(reference_response(), spec_draft_tokens=None))


def test_metrics_exposition_is_parsed_and_summed_over_label_sets():
    text = (
        "# HELP sglang:num_running_reqs The number of running requests.\n"
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{engine_type="unified",model_name="m",dp_rank="0"} 41.0\n'
        'sglang:num_running_reqs{engine_type="unified",model_name="m",dp_rank="1"} 1.0\n'
        "# TYPE sglang:generation_tokens_total counter\n"
        'sglang:generation_tokens_total{engine_type="unified",is_streaming="false",model_name="m"} 1.234567e+07\n'
    )
    metrics = proto.parse_metrics(text)
    assert metrics == {"sglang:num_running_reqs": 42.0, "sglang:generation_tokens_total": 12345670.0}
    assert proto.reported_load(metrics) is None  # no queue gauge: the load is unknown, not zero


def test_a_recorded_sglang_exposition_is_parsed():
    """The literal /metrics sample of the SGLang reference (scheduler and tokenizer metrics of one TP rank)."""
    reference = require_shared("reference", "sglang.md").read_text()
    sample = reference.split("Literal exposition", 1)[1].split("```", 2)[1]
    metrics = proto.parse_metrics(sample)
    assert metrics["sglang:num_running_reqs"] == 41 and metrics["sglang:num_queue_reqs"] == 87
    assert metrics["sglang:generation_tokens_total"] == 12_345_670
    assert proto.reported_load(metrics) == 128


def test_text_that_is_not_an_exposition_is_refused():
    with pytest.raises(ValueError):
        proto.parse_metrics("<html>502 Bad Gateway</html>\n")


@pytest.mark.parametrize(
    ("status", "body", "kind", "retryable"),
    [
        (400, proto.e3_body(proto.msg_input_too_long(70000, 65536)), client.CONTEXT_LENGTH, False),
        (400, proto.e3_body(proto.msg_total_too_long(65536, 100, 65536)), client.CONTEXT_LENGTH, False),
        (400, proto.e3_body(proto.msg_input_exceeds_max(65530, 65525)), client.CONTEXT_LENGTH, False),
        (400, proto.e3_body(proto.msg_duplicate_rid("abc")), client.DUPLICATE_RID, True),
        (400, proto.e2_body("unknown field `foo`, expected one of `max_new_tokens`"), client.BAD_REQUEST, False),
        (400, proto.e1_body("1 validation error"), client.BAD_REQUEST, False),
        (401, proto.UNAUTHORIZED_BODY, client.UNAUTHORIZED, False),
        (404, b"Not Found", client.NOT_FOUND, False),
        (503, proto.e4_body(503, proto.MSG_QUEUE_FULL), client.QUEUE_FULL, True),
        (503, proto.e4_body(503, "Request waiting timeout reached."), client.SERVER_UNAVAILABLE, True),
        (502, b"bad gateway", client.SERVER_UNAVAILABLE, True),
        (500, b"Internal Server Error", client.SERVER_ERROR, True),
    ],
)
def test_every_error_shape_maps_to_a_typed_error(status, body, kind, retryable):
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    error = client.classify_http_error(status, raw, url="http://h:1")
    assert (error.kind, error.retryable, error.status) == (kind, retryable, status)
    assert error.message and "http://h:1" in str(error)


def test_errors_survive_pickling_for_multiprocess_executors():
    error = client.SGLangError(client.QUEUE_FULL, "The request queue is full.", status=503, url="http://h:1")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.kind, copy.retryable, copy.status, copy.message) == (
        "queue_full",
        True,
        503,
        "The request queue is full.",
    )


def test_abort_bodies_are_errors_never_results():
    body = {
        "text": "partial",
        "output_ids": [1, 2],
        "meta_info": {**REFERENCE_META, "completion_tokens": 2, "finish_reason": proto.finish_abort()},
    }
    with pytest.raises(client.SGLangError) as caught:
        client._result_from_body(body, "rid", "http://h:1")
    assert caught.value.kind == client.ABORTED and caught.value.retryable and caught.value.partial.output_ids == [1, 2]
    body["meta_info"]["finish_reason"] = proto.finish_abort("The request queue is full.", 503)
    with pytest.raises(client.SGLangError) as caught:
        client._result_from_body(body, "rid", "http://h:1")
    assert caught.value.kind == client.QUEUE_FULL


def length_stop(tokens: int) -> dict:
    meta = {key: value for key, value in REFERENCE_META.items() if not key.startswith("spec_")}
    meta |= {"finish_reason": proto.finish_length(tokens), "completion_tokens": tokens}
    meta["weight_versions"] = [{"version": "default", "start": 0, "end": tokens}]
    return {"text": "...", "output_ids": [760] * tokens, "meta_info": meta}


def test_a_length_stop_short_of_the_requests_budget_is_a_fragment_not_an_answer():
    sampling = {"max_new_tokens": 32768}
    fragment = length_stop(3)  # a server answering 200, finish_reason length, after 3 of 32,768 tokens
    assert proto.check_generate_response(fragment, sampling=sampling, spec_draft_tokens=None) == [
        "length stop after 3 tokens, short of the request's max_new_tokens 32768"
    ]
    with pytest.raises(client.SGLangError) as caught:
        client._result_from_body(fragment, "rid", "http://h:1", sampling)
    error = caught.value
    assert (error.kind, error.retryable, error.url, error.partial.output_ids) == (
        client.CUT_SHORT,
        True,
        "http://h:1",
        [760] * 3,
    )
    assert str(error).startswith("cut_short from http://h:1: length stop after 3 tokens, short of the request's")
    # At the budget, a length stop is an answer that hit max_new_tokens (the training set's length_capped).
    capped = length_stop(32768)
    assert proto.check_generate_response(capped, sampling=sampling, spec_draft_tokens=None) == []
    assert client._result_from_body(capped, "rid", "http://h:1", sampling).completion_tokens == 32768
    # Uncapped (null: to the context) has no budget to fall short of.
    assert client._result_from_body(fragment, "rid", "http://h:1", {"max_new_tokens": None}).completion_tokens == 3
