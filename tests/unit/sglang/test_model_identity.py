"""The served model's identity: Qwen3.6-27B's as the project knows it, names compared, the vocabulary read from a
refusal, the forcing probe as the simulator answers it, and the client's vocabulary checks."""

from __future__ import annotations

import asyncio
import random

import pytest

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.answer_contract import Served
from dagster_project.sglang.client import (
    ANSWER_OUT_OF_VOCAB,
    INPUT_OUT_OF_VOCAB,
    SGLangClient,
    SGLangError,
    _result_from_body,
)
from dagster_project.sglang.model_identity import (
    QWEN3_6_27B,
    forced_token,
    forced_token_params,
    names_model,
    vocab_from_refusal,
    vocab_probe_params,
)
from dagster_project.sglang.sim.config import SimConfig, load_sim_vocab
from dagster_project.sglang.sim.outputs import OutputModel
from dagster_project.tokenizer import special_ids
from tests.support.training_shards import tokenizer


def test_qwen3_6_27b_is_the_shipped_config_and_the_tokenizer_ends_answers_with_im_end():
    assert (QWEN3_6_27B.model, QWEN3_6_27B.architecture, QWEN3_6_27B.vocab_size) == (
        "Qwen/Qwen3.6-27B",
        "Qwen3_5ForConditionalGeneration",
        248320,
    )
    ids = special_ids(tokenizer())
    assert QWEN3_6_27B.eos_token_id == ids.turn_end == ids.eos_ids[0]
    assert ids.vocab_size <= QWEN3_6_27B.vocab_size  # every id the tokenizer writes lies in the served vocabulary
    default = SimConfig()  # the simulator serves it unless told otherwise
    assert (default.model_path, default.architecture, default.vocab_size) == (
        QWEN3_6_27B.model,
        QWEN3_6_27B.architecture,
        QWEN3_6_27B.vocab_size,
    )


@pytest.mark.parametrize(
    ("reported", "same"),
    [
        ("Qwen/Qwen3.6-27B", True),
        ("/models/Qwen3.6-27B/", True),
        ("/root/.cache/huggingface/hub/models--Qwen--Qwen3.6-27B/snapshots/0a1b2c", True),
        ("qwen3.6-27b", True),
        ("meta-llama/Llama-3.1-8B-Instruct", False),
        ("Qwen/Qwen3.6-27B-FP8", False),
        ("", False),
        (None, False),
    ],
)
def test_a_model_is_named_by_its_hub_name_or_any_path_ending_in_it(reported, same):
    assert names_model(reported, QWEN3_6_27B.model) is same


def test_the_vocabulary_is_read_from_the_servers_own_refusal_of_the_probe():
    for vocab in (QWEN3_6_27B.vocab_size, 128256):
        with pytest.raises(ValueError) as refused:  # the server's words (SamplingParams.verify), as the sim says them
            proto.check_sampling_values(vocab_probe_params(), vocab)
        assert vocab_from_refusal(str(refused.value)) == vocab
    assert vocab_from_refusal("The input_ids contains values greater than the vocab size") is None


def test_a_forcing_logit_bias_makes_the_simulator_write_that_token_and_stop_on_an_eos():
    model = OutputModel(SimConfig(output_len="fixed:40"), load_sim_vocab())
    eos = QWEN3_6_27B.eos_token_id
    params = forced_token_params(eos)
    assert forced_token(params) == eos and forced_token({"logit_bias": {"5": 3.0}}) is None
    answer = model.plan([0], "h", params, max_new_tokens=1)
    assert answer.output_ids == [eos] and answer.finish_reason == {"type": "stop", "matched": eos}
    word = model.vocab.words[0]  # a token that ends nothing: the answer runs on to its cap
    answer = model.plan([0], "h", forced_token_params(word), max_new_tokens=1)
    assert answer.output_ids == [word] and answer.finish_reason["type"] == "length"


def test_the_client_never_sends_an_id_outside_the_served_vocabulary():
    # Nothing listens on this port: a request that were sent would fail to connect instead.
    client = SGLangClient(f"http://127.0.0.1:{random.randint(20000, 20999)}")

    async def send():
        async with client:
            await client.generate([1, 2, 248320], {"max_new_tokens": 4}, served=Served(248320))

    with pytest.raises(SGLangError) as refused:
        asyncio.run(send())
    assert refused.value.kind == INPUT_OUT_OF_VOCAB and not refused.value.retryable
    assert "id 248320 at position 2 lies outside the vocabulary [0, 248,320)" in refused.value.message


def test_an_answer_holding_an_id_outside_the_served_vocabulary_is_a_retryable_fault():
    body = {
        "text": "x",
        "output_ids": [5, 250001],
        "meta_info": {"finish_reason": {"type": "length"}, "prompt_tokens": 1, "completion_tokens": 2},
    }
    assert _result_from_body(body, "r", "http://s").output_ids == [5, 250001]  # unchecked without a vocabulary
    with pytest.raises(SGLangError) as fault:
        _result_from_body(body, "r", "http://s", served=Served(248320))
    assert fault.value.kind == ANSWER_OUT_OF_VOCAB and fault.value.retryable
    assert "id 250001 at position 1" in fault.value.message
