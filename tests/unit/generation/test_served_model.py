"""Never another model's answers: the dispatcher checks each server's served model before its first request and at
every re-probe, and sets aside a server of another model, or one whose answers hold ids outside the vocabulary,
naming it and what differs (on a virtual clock with in-process servers)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import pytest

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest, Outcome
from dagster_project.generation.served_model import MODEL_MISMATCH, ExpectedModel, ServedModelMismatch
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.client import ANSWER_OUT_OF_VOCAB, BAD_REQUEST, TIMEOUT, GenerateResult, SGLangError
from dagster_project.sglang.model_identity import QWEN3_6_27B, forced_token
from tests.support.virtual_fleet import FakeServer, VirtualClockLoop, now, run_virtual

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
CANARY = (0,)  # the one-token request every re-probe sends


class ModelServer(FakeServer):
    """A `FakeServer` that serves a model: it names it in `/server_info` and `/model_info`, refuses a `logit_bias`
    key outside its vocabulary with SGLang's words, and writes the token a large bias forces (stopping on its EOS).
    `foreign_ids`: its answers hold an id past the vocabulary (the client's fault for such an answer)."""

    def __init__(self, url: str, *, model: str = QWEN3_6_27B.model, foreign_ids: bool = False, **options):
        super().__init__(url, **options)
        self.model, self.foreign_ids = model, foreign_ids
        self.architecture, self.vocab, self.eos = QWEN3_6_27B.architecture, QWEN3_6_27B.vocab_size, 248046
        self.stop_matched: int | None = None  # the id its stop reports matching, if not the token written

    async def server_info(self, timeout: float | None = None) -> dict:
        return {**await super().server_info(timeout), "model_path": self.model, "served_model_name": self.model}

    async def model_info(self, timeout: float | None = None) -> dict:
        return {"model_path": self.model, "served_model_name": self.model, "architectures": [self.architecture]}

    async def generate(self, input_ids: Sequence[int], sampling_params: dict, rid=None, timeout=None, **options):
        if sampling_params.get("logit_bias"):  # a probe of the served model
            try:
                proto.check_sampling_values(sampling_params, self.vocab)
            except ValueError as exc:
                raise SGLangError(BAD_REQUEST, str(exc), status=400, url=self.base_url, rid=rid) from None
            token = forced_token(sampling_params)
            matched = token if self.stop_matched is None else self.stop_matched
            finish = {"type": "stop", "matched": matched} if token == self.eos else {"type": "length", "length": 1}
            meta = {"id": rid, "finish_reason": finish, "prompt_tokens": 1, "completion_tokens": 1}
            return GenerateResult(rid or "", "", [token], finish, meta, 1, 1)
        result = await super().generate(input_ids, sampling_params, rid, timeout, **options)
        if self.foreign_ids and tuple(input_ids) != CANARY:
            raise SGLangError(
                ANSWER_OUT_OF_VOCAB, f"the answer's id {self.vocab + 7} lies outside the vocabulary", url=self.base_url
            )
        return result

    def requests_received(self, since: float = 0.0) -> list[tuple[int, ...]]:
        """The /generate requests it got that were not a re-probe's canary."""
        return [ids for at, ids in self.received if ids != CANARY and at >= since]


def _requests(count: int) -> list[GenRequest]:
    return [GenRequest(f"e{i}", [7, 8, 9, i], {"max_new_tokens": 64}) for i in range(count)]


def _dispatch(servers: list[ModelServer], count: int, during=None) -> tuple[Dispatcher, dict[str, Outcome]]:
    loop, by_url = VirtualClockLoop(), {server.base_url: server for server in servers}
    dispatcher = Dispatcher(
        list(by_url),
        DispatchOptions(canary_timeout_s=10.0),
        clock=loop.time,
        connect=by_url.__getitem__,
        expected_model=ExpectedModel().identity(),
    )
    outcomes: dict[str, Outcome] = {}

    def on_outcome(outcome: Outcome) -> None:
        assert outcome.request.key not in outcomes, f"{outcome.request.key} ended twice"
        outcomes[outcome.request.key] = outcome

    async def run():
        side = asyncio.ensure_future(during()) if during else None
        try:
            return await asyncio.wait_for(dispatcher.run(_requests(count), on_outcome), 1800)
        finally:
            if side is not None:
                side.cancel()

    run_virtual(run(), loop)
    return dispatcher, outcomes


def test_a_server_declaring_another_model_gets_no_request_and_is_named_with_what_differs(caplog):
    llama, qwen = ModelServer("http://llama", model=LLAMA), ModelServer("http://qwen", answer_s=0.5)
    with caplog.at_level(logging.WARNING, logger="dagster_project.generation.resend"):
        dispatcher, outcomes = _dispatch([llama, qwen], 20)
    assert len(outcomes) == 20 and all(o.ok and o.server == "http://qwen" for o in outcomes.values())
    assert {o.served_model for o in outcomes.values()} == {QWEN3_6_27B.label}  # what every row records
    assert llama.requests_received() == []  # not one of its answers was even asked for
    reason = dispatcher.snapshot()["servers"]["http://llama"]["reason"]
    assert reason.startswith(f"{MODEL_MISMATCH}: it does not serve Qwen/Qwen3.6-27B")
    assert f"/server_info names model_path '{LLAMA}'" in reason and f"/model_info names model_path '{LLAMA}'" in reason
    (warning,) = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]  # the run log's line
    assert warning.startswith(f"server http://llama set aside ({MODEL_MISMATCH}") and LLAMA in warning


def test_another_vocabulary_architecture_or_eos_is_named_too():
    other = ModelServer("http://other")
    other.vocab, other.architecture, other.eos = 151936, "Qwen2ForCausalLM", 151645
    dispatcher, outcomes = _dispatch([other, ModelServer("http://qwen")], 5)
    reason = dispatcher.snapshot()["servers"]["http://other"]["reason"]
    assert "its vocabulary has 151,936 ids, not 248,320" in reason
    assert "architectures ['Qwen2ForCausalLM'] lack Qwen3_5ForConditionalGeneration" in reason
    assert other.requests_received() == [] and all(o.server == "http://qwen" for o in outcomes.values())
    same_vocab = ModelServer("http://same-vocab")
    same_vocab.eos = 1  # its tokenizer ends answers with another id
    dispatcher, _ = _dispatch([same_vocab, ModelServer("http://qwen")], 5)
    assert "id 248046 does not end its answers" in dispatcher.snapshot()["servers"]["http://same-vocab"]["reason"]


def test_a_server_whose_stop_on_the_eos_matched_another_id_is_named():
    """It writes the forced id and stops, but the stop matched another id (its tokenizer's own end of turn, listed
    as a stop token): the job's EOS does not end its answers, and it is set aside."""
    other_stop = ModelServer("http://other-stop")
    other_stop.stop_matched = 151645
    dispatcher, outcomes = _dispatch([other_stop, ModelServer("http://qwen")], 5)
    reason = dispatcher.snapshot()["servers"]["http://other-stop"]["reason"]
    assert "id 248046 does not end its answers" in reason and "151645" in reason
    assert other_stop.requests_received() == [] and all(o.server == "http://qwen" for o in outcomes.values())


def test_a_fleet_of_another_model_stops_the_run_before_any_request():
    servers = [ModelServer("http://a", model=LLAMA), ModelServer("http://b", model=LLAMA)]
    with pytest.raises(ServedModelMismatch) as refused:
        _dispatch(servers, 5)
    message = str(refused.value)
    assert message.startswith("no server serves Qwen/Qwen3.6-27B") and "nothing was sent" in message
    assert "http://a: served_model_mismatch" in message and "http://b: served_model_mismatch" in message
    assert all(server.received == [] for server in servers)


def test_a_server_answering_with_ids_outside_the_vocabulary_is_set_aside_for_the_run():
    foreign, qwen = ModelServer("http://foreign", foreign_ids=True), ModelServer("http://qwen", answer_s=2.0)
    dispatcher, outcomes = _dispatch([foreign, qwen], 30)
    assert len(outcomes) == 30 and all(o.ok and o.server == "http://qwen" for o in outcomes.values())
    view = dispatcher.snapshot()["servers"]["http://foreign"]
    # Its re-probes pass (it names the model, its vocabulary and EOS are right), yet it stays out: one answer of
    # another vocabulary is enough.
    assert view["state"] == "quarantined" and view["reason"].startswith(ANSWER_OUT_OF_VOCAB)
    assert len(foreign.requests_received()) <= view["window"]  # only its first fill, sent before any answer


def test_a_server_that_comes_back_as_another_model_stays_set_aside():
    flipping, qwen = ModelServer("http://flipping", failing=True), ModelServer("http://qwen", answer_s=2.0)
    flipped_at = 1.0

    async def restart_as_llama():  # its operator restarts it with another checkpoint
        await asyncio.sleep(flipped_at)
        flipping.model, flipping.failing = LLAMA, False

    dispatcher, outcomes = _dispatch([flipping, qwen], 40, during=restart_as_llama)
    assert all(o.ok and o.server == "http://qwen" for o in outcomes.values())
    view = dispatcher.snapshot()["servers"]["http://flipping"]
    assert view["state"] == "quarantined" and view["reason"].startswith(MODEL_MISMATCH)
    assert flipping.requests_received(since=flipped_at) == []


def test_dflash_status_names_the_server_of_another_model_and_what_differs():
    """The dispatcher's view of the server, as a running shard's heartbeat carries it, becomes a `dflash status`
    alert naming the server and the model it declares."""
    from dagster_project.generation.progress import Heartbeat
    from tests.unit.ops.test_shard_states import HOST, PID, STARTED, _alerts, readings, store_of

    dispatcher, _ = _dispatch([ModelServer("http://llama", model=LLAMA), ModelServer("http://qwen")], 5)
    beat = Heartbeat(
        shard=2, state="running", settings_fingerprint="f", started_at=0.0, updated_at=time.time(), total_events=9,
        resumed_events=0, done_events=5, remaining_events=4, ok_events=5, host=HOST, pid=PID, process_start=STARTED,
        servers=dispatcher.snapshot()["servers"],
    )  # fmt: skip
    alert = _alerts(readings(4, **{**store_of({}), "heartbeats": [beat]}))["server"]
    assert alert.startswith(f"http://llama: the run of shard 2 set it aside: {MODEL_MISMATCH}: it does not serve Qwen")
    assert LLAMA in alert and alert.endswith("no shard sends it work — stop it or point it at the right model")


class HungGenerate(ModelServer):
    """Names the model and answers `/health`, but every `/generate` hangs, the served-model probes' too."""

    async def generate(self, input_ids: Sequence[int], sampling_params: dict, rid=None, timeout=None, **options):
        return await FakeServer.generate(self, input_ids, sampling_params, rid, timeout, **options)


def test_a_server_whose_first_probe_hangs_holds_no_other():
    # The trial: beside a healthy server, one whose /generate hangs kept the whole run from sending anything until
    # its served-model probe timed out (canary_timeout_s, 120 s by default). Each server now joins on its own.
    hung, qwen = HungGenerate("http://hung", lost=True), ModelServer("http://qwen", answer_s=2.0)
    loop = VirtualClockLoop()
    options = DispatchOptions()
    dispatcher = Dispatcher(
        [hung.base_url, qwen.base_url],
        options,
        clock=loop.time,
        connect={hung.base_url: hung, qwen.base_url: qwen}.__getitem__,
        expected_model=ExpectedModel().identity(),
    )
    answered_at: dict[str, float] = {}
    hung_seen: list[tuple[float, str, str | None]] = []  # (time, its state, its reason) at each answer

    def on_outcome(outcome: Outcome) -> None:
        assert outcome.request.key not in answered_at, f"{outcome.request.key} ended twice"
        answered_at[outcome.request.key] = now()
        view = dispatcher.snapshot()["servers"][hung.base_url]
        hung_seen.append((now(), view["state"], view["reason"]))

    run_virtual(dispatcher.run(_requests(400), on_outcome), loop)
    assert sorted(answered_at) == sorted(r.key for r in _requests(400))  # each once, none lost
    assert min(answered_at.values()) < 30.0  # as soon as the healthy server answers (2 s), not after 120 s
    set_aside = [(at, reason) for at, state, reason in hung_seen if state == "quarantined"]
    assert set_aside and set_aside[0][1].startswith(TIMEOUT)
    # Set aside at its probe's timeout (and an answer of the other server later, 0.4 s apart), not before.
    assert options.canary_timeout_s <= set_aside[0][0] < options.canary_timeout_s + 1.0, set_aside[0]
    assert all(state == "unprobed" for at, state, _ in hung_seen if at < options.canary_timeout_s)
    prompts = {tuple(r.input_ids) for r in _requests(400)}
    assert not prompts & set(hung.requests_received())  # it never got one of the shard's requests
