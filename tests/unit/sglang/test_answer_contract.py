"""The answer contract: each rule an answer can break, refused by the client as a retryable fault of its server."""

from __future__ import annotations

import pytest

from dagster_project.sglang import answer_contract as contract
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.client import SGLangError, _result_from_body
from dagster_project.tokenizer import special_ids
from tests.support.training_shards import tokenizer

EOS = 248046
WORD = 760
SERVED = contract.Served(248320, frozenset({EOS}))
PARAMS = {"max_new_tokens": 8}


def body(ids: list[int], finish: dict, text: str = "...") -> dict:
    meta = {"finish_reason": finish, "prompt_tokens": 3, "completion_tokens": len(ids)}
    return {"text": text, "output_ids": ids, "meta_info": meta}


@pytest.mark.parametrize(
    ("ids", "finish", "params", "kind", "detail"),
    [
        # 2.5 M ids for a request of 32,768 in the trial; the same at a smaller scale.
        ([WORD] * 17, proto.finish_length(17), PARAMS, contract.OVER_BUDGET, "17 output ids for a request of"),
        (
            [WORD, EOS, WORD, EOS],
            proto.finish_stop(EOS),
            PARAMS,
            contract.END_MID_ANSWER,
            "end id 248046 at position 1",
        ),
        ([WORD, EOS, WORD, WORD, WORD, WORD, WORD, WORD], proto.finish_length(8), PARAMS, contract.END_MID_ANSWER, ""),
        ([WORD, WORD], proto.finish_stop(EOS), PARAMS, contract.STOP_NOT_AT_END, "stop on id 248046 but the ids end"),
        ([WORD, 250001, EOS], proto.finish_stop(EOS), PARAMS, contract.ANSWER_OUT_OF_VOCAB, "id 250001 at position 1"),
        ([WORD, EOS], proto.finish_stop(proto.NAN_STOP), PARAMS, contract.SAMPLING_FAILED, "NaN happened"),
        ([WORD] * 3, proto.finish_length(3), PARAMS, contract.CUT_SHORT, "length stop after 3 tokens"),
        # A stop id the request asked for ends the answer; written before the end, it breaks it.
        ([WORD, 13, WORD, 13], proto.finish_stop(13), {**PARAMS, "stop_token_ids": [13]}, contract.END_MID_ANSWER, ""),
    ],
)
def test_each_broken_rule_is_a_retryable_fault_of_the_server(ids, finish, params, kind, detail):
    found = contract.breach(ids, finish, params, SERVED)
    assert found is not None and found.kind == kind and detail in found.detail
    with pytest.raises(SGLangError) as refused:
        _result_from_body(body(ids, finish), "r", "http://s:1", params, SERVED)
    assert (refused.value.kind, refused.value.retryable, refused.value.url) == (kind, True, "http://s:1")
    assert refused.value.partial.output_ids == ids  # kept for diagnostics, never as an answer
    assert contract.BREACHES[kind] in str(found)


@pytest.mark.parametrize(
    ("ids", "finish", "params"),
    [
        ([WORD] * 5 + [EOS], proto.finish_stop(EOS), PARAMS),  # a stop on the end id, as the last id
        ([WORD] * 8, proto.finish_length(8), PARAMS),  # a length stop at the budget
        ([WORD] * 7 + [EOS], proto.finish_length(8), PARAMS),  # the end id written at the budget is a length stop
        ([WORD, WORD], proto.finish_stop("</answer>"), PARAMS),  # a stop string trims only the text
        ([WORD, EOS, WORD] + [WORD] * 5, proto.finish_length(8), {**PARAMS, "ignore_eos": True}),  # EOS ignored
        ([WORD, EOS], proto.finish_stop(EOS), None),  # no params known: no budget to hold it to
    ],
)
def test_answers_that_keep_the_contract_are_answers(ids, finish, params):
    assert contract.breach(ids, finish, params, SERVED) is None
    assert _result_from_body(body(ids, finish), "r", "http://s:1", params, SERVED).output_ids == ids


def test_without_the_served_model_only_the_request_bounds_the_answer():
    unknown = contract.Served()
    assert contract.breach([WORD, 250001, EOS], proto.finish_stop(EOS), PARAMS, unknown) is None
    # The id a stop matched is an end id whatever the model: before the end it breaks the answer.
    assert contract.breach([EOS, WORD, EOS], proto.finish_stop(EOS), PARAMS, unknown).kind == contract.END_MID_ANSWER
    assert contract.breach([WORD] * 9, proto.finish_length(9), PARAMS, unknown).kind == contract.OVER_BUDGET


def test_the_body_bound_is_a_few_times_the_largest_legal_answer():
    limit = contract.body_limit({"max_new_tokens": 32768})
    # A legal answer: 32,768 ids of up to 7 digits and a comma, and their text; far below the bound.
    assert 32768 * 8 * 4 < limit < 50_000_000  # the trial's 50 MB bodies are refused
    assert contract.body_limit({"max_new_tokens": None}) > limit  # no cap: bounded by any context
    assert contract.body_limit({"max_new_tokens": 1}) >= 1 << 20


def test_the_stored_text_is_the_decoding_of_the_ids_never_the_servers():
    tok = tokenizer()
    eos = special_ids(tok).turn_end
    ids = tok.encode("The answer is 4.", add_special_tokens=False) + [eos]
    decode = tok.decode
    assert contract.answer_text(decode, ids, proto.finish_stop(eos)) == "The answer is 4."  # the stop id trimmed
    assert contract.answer_text(decode, ids[:-1], proto.finish_length(len(ids) - 1)) == "The answer is 4."


def test_breaches_are_described_for_the_operator():
    counts = contract.breaches_of({contract.END_MID_ANSWER: 11, "timeout": 2, contract.OVER_BUDGET: 6})
    assert counts == {contract.OVER_BUDGET: 6, contract.END_MID_ANSWER: 11}
    assert contract.describe(counts) == "more output ids than max_new_tokens 6, end-of-turn mid-answer 11"
