"""A shard end to end for each model family on the simulator (issue 46): the job's model set only by
`DFLASH_TOKENIZER` and `DFLASH_SERVED_MODEL`, a simulator fleet serving that model (`SimFleet.start(tokenizer=...)`,
as `dflash fleet up --simulate` does under those settings), and the stages run as Dagster runs them with the
resources the environment configures: raw_prompts → conversations → completions over HTTP → training_set.

The source is small: multi-turn chats (LLaMA-Factory's kto sample, OpenAI messages) and tool-calling chats (its
glaive sample, written here as OpenAI messages with `tool_calls` and `tool` results: one without call ids, as glaive
writes it, one with ids as OpenAI writes them, one with ids as Mistral writes them). Every training row is checked
against an independent render, `transformers`' own `apply_chat_template` on the family's tokenizer directory (for
Mistral NeMo, mistral-common's own encoder), of the messages this test reads from its own source files (never the
project's conversations): the source's earlier turns for a tool-calling chat, the model's own earlier answers (decoded
here from the rows) for a plain one; the rest of the row is the model's answer, text of that tokenizer ending on its
end id, with reasoning markers exactly when the template reasons."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dagster_project.assets.completions import completions
from dagster_project.assets.conversations import conversations
from dagster_project.assets.raw_prompts import RawPromptsConfig, raw_prompts
from dagster_project.assets.training_set import training_set
from dagster_project.checks import completions as completions_checks
from dagster_project.checks import conversations as conversations_checks
from dagster_project.checks import training_set as training_set_checks
from dagster_project.conversations.shards import read_conversations
from dagster_project.partitions import NUM_SHARDS
from dagster_project.resources.environment import resources_from_env
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import load_tokenizer, tokenizer_profile
from dagster_project.training.shards import iter_training_batches
from tests.support.dagster_helpers import FAST_ANSWERS, assert_token_exact, request_logs
from tests.support.model_families import (
    DEEPSEEK,
    MISTRAL,
    QWEN3,
    QWEN3_6,
    SERVED_MODELS,
    family_settings,
    family_tokenizer,
    mistral_reference,
)
from tests.support.paths import require_shared
from tests.support.pilots import pass_pilot
from tests.support.sglang_fixtures import call

# With their ids (chat-N) these chats fall in every one of the default four shards: none is empty.
CHATS = (0, 1, 2, 6)
FAMILIES = [QWEN3_6, QWEN3, DEEPSEEK, MISTRAL]
# The call ids of each tool-calling chat's source, formatted with the call's number in it: none (as glaive writes
# them: ingest makes them up), ids as OpenAI writes them (which Mistral's template refuses: its render fits them), ids
# as Mistral writes them (9 letters and digits: kept as they are).
TOOL_CALL_IDS = [None, "call_{number}Xq7vB2mWk9RtLp4sHd6Yc3", "Nemo{number}Call"]
MISTRAL_CALL_ID = re.compile("[A-Za-z0-9]{9}")
SHARD_RUN = [
    completions,
    training_set,
    *dg.load_asset_checks_from_modules([completions_checks]),
    *dg.load_asset_checks_from_modules([training_set_checks]),
]
EVERY_SHARD = {
    "dagster/asset_partition_range_start": layout.partition_key(0),
    "dagster/asset_partition_range_end": layout.partition_key(NUM_SHARDS - 1),
}
# How each template renders an earlier turn of the model's: whether the row is the finished exchange's render (it
# renders the last turn's reasoning: the row, then what the template writes after the end id), else only its answer.
RENDERS_LAST_REASONING = {QWEN3_6: True, QWEN3: True, DEEPSEEK: False, MISTRAL: False}


def _chats() -> list[dict[str, Any]]:
    records = json.loads(require_shared("data", "LLaMA-Factory", "kto_en_demo.json").read_text())
    chats = [r["messages"] for r in records if len(r["messages"]) > 2]
    return [{"id": f"chat-{n}", "messages": chats[n]} for n in CHATS]


def _tool_chats() -> list[dict[str, Any]]:
    """Glaive chats that open with a call (user, call, result, answer, ...) in OpenAI's form: a call is an assistant
    message with `tool_calls` (arguments an object, the id of `TOOL_CALL_IDS` where it has one), its result a `tool`
    message (naming the call's id where the call has one), the tools wrapped as functions."""
    records = json.loads(require_shared("data", "LLaMA-Factory", "glaive_toolcall_en_demo.json").read_text())
    roles = {"human": "user", "gpt": "assistant", "observation": "tool"}
    chats = []
    for record in records:
        turns = record["conversations"]
        if [turn["from"] for turn in turns[:3]] != ["human", "function_call", "observation"]:
            continue
        ids = TOOL_CALL_IDS[len(chats)]
        messages: list[dict[str, Any]] = []
        calls = 0
        for turn in turns:
            if turn["from"] == "function_call":
                call = json.loads(turn["value"])
                made = {"type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
                if ids:
                    made["id"] = ids.format(number=calls)
                messages.append({"role": "assistant", "content": "", "tool_calls": [made]})
                calls += 1
            elif turn["from"] == "observation" and ids:
                messages.append(
                    {"role": "tool", "content": turn["value"], "tool_call_id": ids.format(number=calls - 1)}
                )
            else:
                messages.append({"role": roles[turn["from"]], "content": turn["value"]})
        tools = [{"type": "function", "function": tool} for tool in json.loads(record["tools"])]
        chats.append({"id": f"tool-{len(chats)}", "messages": messages, "tools": tools})
        if len(chats) == len(TOOL_CALL_IDS):
            return chats
    raise AssertionError("the glaive sample has fewer chats that open with a call than the test writes")


def _write_sources(folder: Path, family: str) -> dict[str, list[dict[str, Any]]]:
    """The source files (OpenAI messages), by path: the rows this test renders independently."""
    folder.mkdir(parents=True)
    sources = {str(folder / "chats.json"): _chats(), str(folder / "tools.json"): _tool_chats()}
    for path, rows in sources.items():
        Path(path).write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    return sources


def _asks(messages: list[dict[str, Any]]) -> list[int]:
    """Indices of the user or tool messages an assistant message answers: one per turn."""
    return [
        i
        for i, message in enumerate(messages[:-1])
        if message["role"] in ("user", "tool") and messages[i + 1]["role"] == "assistant"
    ]


def _split(tok, output: list[int]) -> tuple[str, str]:
    """(reasoning, answer) of an output as the model wrote it: the text around `</think>`, markers left out."""
    text = tok.decode(output, skip_special_tokens=True)
    reasoning, _, answer = text.rpartition("</think>")
    return reasoning.replace("<think>", "").strip(), answer.strip()


def _independent_prompt(tok, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[int]:
    """transformers' render of the family's template."""
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def _mistral_encoding(messages: list[dict[str, Any]], tools: list[dict] | None) -> list[int]:
    """mistral-common's own request encoder, Mistral NeMo's reference."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    request = ChatCompletionRequest.from_openai(messages=messages, tools=tools)
    return _mistral_reference().encode_chat_completion(request).tokens


@functools.cache
def _mistral_reference():
    return mistral_reference()


def _with_the_rows_call_ids(tok, prompt: list[int], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The source's messages with the call ids the row's prompt writes (mistral-common refuses any but 9 letters and
    digits, and a source without ids has none to give it), each result naming the call it answers: the one its source
    names, else the next of the message before it. The source's ids that are 9 letters and digits already must be in
    the row as they are, and the ids of a prompt must all differ."""
    blocks = re.findall(r"\[TOOL_CALLS\](\[.*?\])</s>", tok.decode(prompt))
    written = [call["id"] for block in blocks for call in json.loads(block)]
    assert len(set(written)) == len(written) and all(MISTRAL_CALL_ID.fullmatch(call_id) for call_id in written)
    ids = iter(written)
    renamed: dict[str, str] = {}  # the source's id -> the row's
    unanswered: list[str] = []
    shown = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [{**call, "id": next(ids)} for call in message["tool_calls"]]
            for source, call in zip(message["tool_calls"], calls, strict=True):
                if source.get("id") is not None:
                    assert call["id"] == source["id"] or not MISTRAL_CALL_ID.fullmatch(source["id"]), "a fitting id"
                    renamed[source["id"]] = call["id"]
            unanswered = [call["id"] for call in calls]
            message = {**message, "tool_calls": calls}
        elif message["role"] == "tool":
            answered = renamed[message["tool_call_id"]] if message.get("tool_call_id") else unanswered[0]
            unanswered.remove(answered)
            message = {**message, "tool_call_id": answered}
        shown.append(message)
    assert next(ids, None) is None
    return shown


def _results_as_the_template_writes(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with each tool result that Mistral's template and mistral-common's encoder write differently given
    to the encoder as a JSON string (its text quoted). The template transformers writes for Mistral's tekken file
    writes a result as a JSON string, except a number whose text reads back as itself; the encoder writes any result
    that is JSON text as its JSON value (`{"content": {"area": 15}, ...}` where the template writes
    `{"content": "{\\"area\\": 15}", ...}`). Quoted, such a result is written by the encoder as the template does."""
    quoted = []
    for message in messages:
        if message["role"] == "tool" and _json_not_the_templates(message["content"]):
            message = {**message, "content": json.dumps(message["content"])}
        quoted.append(message)
    return quoted


def _json_not_the_templates(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False  # not JSON: a string to both
    return isinstance(value, bool) or not isinstance(value, int | float) or str(value) != text


def _as_family_template_takes(family: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DeepSeek-R1's template joins a call's arguments to text: it is given them as JSON text."""
    if family != DEEPSEEK:
        return messages
    shown = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [
                {
                    **call,
                    "function": {
                        **call["function"],
                        "arguments": json.dumps(call["function"]["arguments"], ensure_ascii=False),
                    },
                }
                for call in message["tool_calls"]
            ]
            message = {**message, "tool_calls": calls}
        shown.append(message)
    return shown


@pytest.mark.parametrize("family", FAMILIES)
def test_a_shard_of_the_familys_model_is_its_templates_render_then_its_answers(
    family, sim_fleet, tmp_path, monkeypatch
) -> None:
    tokenizer = family_tokenizer(family)
    fleet = sim_fleet(
        2,
        **({} if family == QWEN3_6 else {"tokenizer": tokenizer, "served_model": SERVED_MODELS[family]}),
        **FAST_ANSWERS,
    )
    for name, value in {
        **family_settings(family),
        "DFLASH_STORE": str(tmp_path / "store"),
        "DFLASH_WORK_DIR": str(tmp_path / "work"),
        "DFLASH_SGLANG_ENDPOINTS": ",".join(fleet.urls),
    }.items():
        monkeypatch.setenv(name, value)
    sources = _write_sources(tmp_path / "sources", family)
    resources = resources_from_env()
    with dg.instance_for_test() as instance:
        # With every conversations check: the turn markers counted are the model's own.
        prepared = dg.materialize(
            [raw_prompts, conversations, *dg.load_asset_checks_from_modules([conversations_checks])],
            resources=resources,
            instance=instance,
            run_config=dg.RunConfig(ops={"raw_prompts": RawPromptsConfig(sources=list(sources))}),
            raise_on_error=False,
        )
        checked = {e.check_name: e.passed for e in prepared.get_asset_check_evaluations()}
        assert prepared.success and checked["conversations_turn_markers"] and all(checked.values()), checked
        pass_pilot(resources, instance)  # the family's own pilot, on its fleet, before the shards
        # One run over every shard, with every check of the two stages, as a backfill runs them.
        built = dg.materialize(
            SHARD_RUN, tags=EVERY_SHARD, resources=resources, instance=instance, raise_on_error=False
        )
    failed = {(e.check_name, e.partition): e.description for e in built.get_asset_check_evaluations() if not e.passed}
    assert failed == {}
    # Tool calls are judged in Qwen3.6's form only; another model's are not judged, and the gate says so.
    tool_gate = [e.description for e in built.get_asset_check_evaluations() if e.check_name == "malformed_tool_calls"]
    assert len(tool_gate) == NUM_SHARDS and all(("not judged" in d) == (family != QWEN3_6) for d in tool_gate)

    store = LocalStore(tmp_path / "store")
    tok = load_tokenizer(tokenizer)
    profile = tokenizer_profile(tok)
    logged = request_logs(fleet)
    rows: dict[str, dict] = {}
    source_of: dict[str, tuple[str, int]] = {}
    for shard in range(NUM_SHARDS):
        # Every row is exactly the ids the simulators received, then exactly the ids they returned.
        assert_token_exact(store, shard, logged)
        rows |= {row["event_id"]: row for batch in iter_training_batches(store, shard) for row in batch.to_pylist()}
        source_of |= {c.id: (c.source_file, c.source_row) for c in read_conversations(store, shard)}
    checked = tool_turns = 0
    for conversation_id, (source_file, source_row) in source_of.items():
        record = sources[source_file.removeprefix("file://")][source_row]
        messages, tools = record["messages"], record.get("tools")
        calls_tools = any(m["role"] == "tool" for m in messages)
        shown: list[dict[str, Any]] = []  # the prompt's messages: the source's, or the model's own earlier answers
        cursor = 0
        for turn, ask in enumerate(_asks(messages)):
            row = rows[f"{conversation_id}#turn{turn}"]
            for message in messages[cursor : ask + 1]:
                if message["role"] != "assistant" or calls_tools:
                    shown.append(message)
            cursor = ask + 1
            prompt_length = row["loss_mask"].index(1)
            prompt, output = row["input_ids"][:prompt_length], row["input_ids"][prompt_length:]
            if family == MISTRAL:
                with_ids = _with_the_rows_call_ids(tok, prompt, shown)
                quoted = _results_as_the_template_writes(with_ids)
                expected = _mistral_encoding(quoted, tools)
                # The one difference between the template's render and the model's reference: JSON results.
                assert (prompt == _mistral_encoding(with_ids, tools)) == (quoted == with_ids)
            else:
                expected = _independent_prompt(tok, _as_family_template_takes(family, shown), tools)
            assert prompt == expected, f"{family} {conversation_id} turn {turn}: the prompt is not the template's"
            assert all(row["loss_mask"][prompt_length:]) and output[-1] == profile.eos_ids[0]
            # The answer is text of this tokenizer: its own encoding of the decoded text is the answer's ids.
            assert tok.encode(tok.decode(output[:-1]), add_special_tokens=False) == output[:-1]
            reasoning, answer = _split(tok, output)
            assert answer
            # Reasoning where the prompt opened the think block or the model opens it itself; none elsewhere (no
            # reasoning template, or DeepSeek-R1's reply to tool results, whose prompt does not open the block).
            prompt_text = tok.decode(prompt)
            opened = prompt_text.rfind("<think>") > prompt_text.rfind("</think>")
            asked = profile.reasoning is not None and (opened or not profile.prompt_opens_reasoning)
            assert ("</think>" in tok.decode(output)) == asked and bool(reasoning) == asked
            if not calls_tools:
                reply = {"role": "assistant", "content": answer, "reasoning_content": reasoning}
                if RENDERS_LAST_REASONING[family]:
                    # The row is the finished exchange's render up to the end id the model wrote.
                    finished = tok.apply_chat_template([*shown, reply], tokenize=False)
                    rendered = tok.encode(finished, add_special_tokens=False)
                    assert rendered[: len(row["input_ids"])] == row["input_ids"]
                    assert not tok.decode(rendered[len(row["input_ids"]) :]).strip()
                shown.append({"role": "assistant", "content": answer})
            tool_turns += messages[ask]["role"] == "tool"
            checked += 1
    assert checked == len(rows) > len(source_of)  # every row checked; multi-turn: more rows than chats
    # The answers to recorded tool results were generated.
    assert tool_turns >= len(TOOL_CALL_IDS)


@pytest.mark.parametrize("family", [QWEN3, DEEPSEEK, MISTRAL])
def test_the_simulator_serves_the_familys_model(family, sim_fleet) -> None:
    """Its name, its vocabulary and end id, and answers in its text: a prompt sent as text is read by its tokenizer."""
    tok = load_tokenizer(family_tokenizer(family))
    profile = tokenizer_profile(tok)
    fleet = sim_fleet(1, tokenizer=family_tokenizer(family), served_model=SERVED_MODELS[family])
    status, info = call(fleet.url(0) + "/model_info")
    assert status == 200 and info["model_path"] == SERVED_MODELS[family]
    reasons = family != MISTRAL  # Qwen3's and DeepSeek-R1's templates reason, Mistral's does not
    assert info["reasoning_parser"] == ("qwen3" if reasons else None)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name three rivers."}], add_generation_prompt=True,
                                     tokenize=False)  # fmt: skip
    status, body = call(fleet.url(0) + "/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 512}})
    assert status == 200
    ids = body["output_ids"]
    assert body["meta_info"]["prompt_tokens"] == len(tok.encode(prompt, add_special_tokens=False))
    assert ids[-1] == profile.eos_ids[0] and max(ids) < profile.vocab_size
    assert body["text"] == tok.decode(ids[:-1])  # the stop token trimmed, as SGLang does
    assert ("</think>" in body["text"]) == reasons and tok.encode(body["text"], add_special_tokens=False) == ids[:-1]
