"""Whether a server serves the job's model: checked before its first request and whenever it rejoins.

A server of another model takes our requests and answers them: its answers look like answers, every gate can
pass, and the training set would teach the drafter another model. An input id at or past its vocabulary kills a
real SGLang server. So before a server gets any request (and when it rejoins after being set aside) its
identity is read and compared with the job's (`ExpectedModel`, the fleet resource's config):

* the model `/server_info` and `/model_info` name (`model_path` or `served_model_name`, a path's last part
  compared, so `/models/Qwen3.6-27B` is `Qwen/Qwen3.6-27B`), and `/model_info`'s `architectures`;
* its vocabulary, from the refusal of a `logit_bias` key past every vocabulary (`model_identity`);
* that the job's end-of-sequence id ends its answers: forced by a large `logit_bias`, it must be the one token
  written and the one the answer stops on.

sglang-router has neither info route and drops `logit_bias` on its way to a worker, so behind a router the
workers themselves are checked, when the fleet resource names them (`router_workers`); otherwise the router's
model cannot be checked, which the run log says, and requests are checked against the job's vocabulary.

A server that differs is set aside, the reason naming what differs; it rejoins only when a re-probe finds the
job's model. Requests then carry the served vocabulary to the client, which refuses to send an input id outside
it and holds every answer to the answer contract: one holding such an id, or the end id mid-answer, is a fault of the
server (`SGLangClient.generate(served=...)`, `sglang.answer_contract`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster_project.sglang.answer_contract import Served
from dagster_project.sglang.client import (
    ANSWER_OUT_OF_VOCAB,
    BAD_REQUEST,
    NOT_FOUND,
    SGLangClient,
    SGLangError,
    new_session,
)
from dagster_project.sglang.model_identity import (
    MODEL_MISMATCH,
    PROBE_INPUT_IDS,
    QWEN3_6_27B,
    ModelIdentity,
    forced_token_params,
    info_names_model,
    vocab_from_refusal,
    vocab_probe_params,
)


class ServedModelMismatch(RuntimeError):
    """No server of the fleet serves the job's model: the run stops before sending anything."""


@dataclass(frozen=True)
class ExpectedModel:
    """The model every server of the job must serve (the fleet resource's config): Qwen3.6-27B by default."""

    served_model: str = field(
        default=QWEN3_6_27B.model,
        metadata={
            "help": "The model the servers must serve: its Hub name, or any path ending in that name (compared with "
            "/server_info's and /model_info's model_path and served_model_name); empty: servers are not checked."
        },
    )
    served_architecture: str = field(
        default=QWEN3_6_27B.architecture,
        metadata={"help": "The architecture /model_info must list; empty: not checked."},
    )
    served_vocab_size: int = field(
        default=QWEN3_6_27B.vocab_size,
        metadata={
            "help": "The served vocabulary (embedding rows); no request holding an id outside it is sent. 0: at "
            "least the job's tokenizer's (DFLASH_TOKENIZER)."
        },
    )
    served_eos_token_id: int = field(
        default=QWEN3_6_27B.eos_token_id,
        metadata={
            "help": "The id the served model ends an answer with (<|im_end|>); a one-token probe checks it. -1: the "
            "one the job's chat template ends an assistant turn with."
        },
    )

    def identity(self) -> ModelIdentity | None:
        """The identity to check servers against, or None when the check is off; what is left to the job's
        tokenizer (vocabulary 0, end id -1) is read from its profile."""
        if not self.served_model:
            return None
        vocab, eos, exact = self.served_vocab_size, self.served_eos_token_id, True
        if vocab <= 0 or eos < 0:
            from dagster_project.settings import tokenizer_name
            from dagster_project.tokenizer import load_tokenizer, tokenizer_profile

            profile = tokenizer_profile(load_tokenizer(tokenizer_name()))
            if vocab <= 0:
                vocab, exact = profile.vocab_size, False
            if eos < 0:
                eos = profile.eos_ids[0]
        return ModelIdentity(self.served_model, self.served_architecture, vocab, eos, vocab_exact=exact)


def _named(source: str, info: Mapping[str, Any], expected: ModelIdentity) -> list[str]:
    if info_names_model(info, expected.model):
        return []
    reported = info.get("model_path"), info.get("served_model_name")
    return [f"{source} names model_path {reported[0]!r}, served_model_name {reported[1]!r}, not {expected.model}"]


def identity_problems(
    server_info: Mapping[str, Any] | None, model_info: Mapping[str, Any] | None, expected: ModelIdentity
) -> list[str]:
    """What the two info routes (None: the endpoint has none, e.g. a router) say that is not the job's model."""
    problems = []
    for source, info in (("/server_info", server_info), ("/model_info", model_info)):
        if info is not None:
            problems += _named(source, info, expected)
    if model_info is not None and expected.architecture:
        architectures = model_info.get("architectures") or []
        if expected.architecture not in architectures:
            problems.append(f"/model_info architectures {architectures} lack {expected.architecture}")
    return problems


async def _info(client: SGLangClient, route: str, timeout: float) -> dict | None:
    try:
        return await (client.server_info if route == "/server_info" else client.model_info)(timeout=timeout)
    except SGLangError as error:
        if error.kind == NOT_FOUND:  # sglang-router serves neither (its workers are checked instead)
            return None
        raise


Generated = Callable[[int], None]  # told the output tokens of each probe answer (the waste ledger's `probes`)


def _uncounted(tokens: int) -> None:
    """A probe answer's tokens, where no ledger counts them (`dflash fleet check`)."""


async def probe_vocab(
    client: SGLangClient, timeout: float, generated: Generated = _uncounted
) -> tuple[int | None, str | None]:
    """(the server's vocabulary size, None), or (None, why it is unknown). A failure of the server raises."""
    try:
        answer = await client.generate(PROBE_INPUT_IDS, vocab_probe_params(), timeout=timeout, require_reasoning=False)
        generated(answer.completion_tokens)
    except SGLangError as error:
        if error.kind != BAD_REQUEST:
            raise
        vocab = vocab_from_refusal(error.message)
        return (vocab, None) if vocab is not None else (None, f"the vocabulary probe was refused: {error.message}")
    return None, "the vocabulary probe (a logit_bias key outside every vocabulary) was answered, not refused"


async def probe_eos(
    client: SGLangClient, eos: int, vocab_size: int, timeout: float, generated: Generated = _uncounted
) -> str | None:
    """Why the job's end-of-sequence id, forced, does not end this server's answer (None: it does)."""
    try:
        result = await client.generate(
            PROBE_INPUT_IDS,
            forced_token_params(eos),
            timeout=timeout,
            require_reasoning=False,
            served=Served(vocab_size),
        )
    except SGLangError as error:
        if error.kind not in (BAD_REQUEST, ANSWER_OUT_OF_VOCAB):
            raise
        return f"the end-of-sequence probe failed: {error}"
    generated(result.completion_tokens)
    if result.output_ids != [eos]:
        return f"forced to write id {eos} it wrote {result.output_ids}: its logits are not over the job's vocabulary"
    if result.finish_reason.get("type") != "stop" or result.finish_reason.get("matched") != eos:
        return f"id {eos} does not end its answers (finish_reason {result.finish_reason}): another tokenizer"
    return None


async def served_model_problems(
    client: SGLangClient,
    expected: ModelIdentity,
    timeout: float,
    workers: Sequence[SGLangClient] = (),
    generated: Generated = _uncounted,
) -> list[str] | None:
    """Everything the server reports or does that is not the job's model (empty: it serves it; None: it cannot be
    told, a router whose `workers` are not known). An `SGLangError` is a failure of the server, not a verdict on
    its model."""
    server_info, model_info = await _info(client, "/server_info", timeout), await _info(client, "/model_info", timeout)
    if server_info is None and model_info is None:  # a router: its workers serve the model
        if not workers:
            return None
        problems = []
        for worker in workers:
            found = await served_model_problems(worker, expected, timeout, generated=generated)
            problems += [f"its worker {worker.base_url}: {problem}" for problem in found or ()]
        return problems
    problems = identity_problems(server_info, model_info, expected)
    vocab, unknown = await probe_vocab(client, timeout, generated)
    if unknown is not None:
        problems.append(unknown)
    elif vocab != expected.vocab_size and (expected.vocab_exact or vocab < expected.vocab_size):
        wanted = (
            f"{expected.vocab_size:,}" if expected.vocab_exact else f"at least the tokenizer's {expected.vocab_size:,}"
        )
        problems.append(f"its vocabulary has {vocab:,} ids, not {wanted}")
    if vocab is not None and expected.eos_token_id < vocab:
        eos_problem = await probe_eos(client, expected.eos_token_id, vocab, timeout, generated)
        if eos_problem is not None:
            problems.append(eos_problem)
    return problems


def mismatch_reason(problems: list[str], expected: ModelIdentity) -> str:
    return f"{MODEL_MISMATCH}: it does not serve {expected.model}: " + "; ".join(problems)


def refuse_fleet(reasons: Mapping[str, str | None], expected: ModelIdentity) -> None:
    """`ServedModelMismatch` when every server (url → why it was set aside; None: usable) serves another model."""
    if reasons and all(reason and reason.startswith(MODEL_MISMATCH) for reason in reasons.values()):
        listed = "\n  ".join(f"{url}: {reason}" for url, reason in reasons.items())
        raise ServedModelMismatch(
            f"no server serves {expected.model} ({expected.label}); nothing was sent to them:\n  {listed}\n"
            "Point the fleet at servers of that model, or set the fleet resource's served_model (DFLASH_SERVED_MODEL) "
            "to the model the job is meant to distil"
        )


async def check_endpoints(
    urls: Sequence[str], expected: ModelIdentity | None, api_key: str | None, timeout: float
) -> Served:
    """Before a sender that bypasses the dispatcher (`dflash tune`) sends any prompt: every server must serve the
    job's model, else `ServedModelMismatch` in one line naming each server and why. Returns what its requests and
    answers are then held to (nothing known when the check is off)."""
    if expected is None:
        return Served()
    async with new_session() as session:

        async def problems_of(url: str) -> list[str] | None:
            try:
                return await served_model_problems(SGLangClient(url, api_key, session), expected, timeout)
            except SGLangError as error:
                return [f"its model could not be checked ({error.kind}: {error.message})"]

        found = await asyncio.gather(*(problems_of(url) for url in urls))
    refused = [f"{url}: {mismatch_reason(problems, expected)}" for url, problems in zip(urls, found) if problems]
    if refused:
        raise ServedModelMismatch("; ".join(refused) + "; no prompt was sent")
    return expected.served()
