"""Exact accounting on the public samples in ../shared/data (ShareGPT, Alpaca, OpenAI messages).

The expected duplicates are derived here from the raw JSON, independently of the pipeline's code:
under `all_turns` two rows are duplicates when their user messages (and where the answers sit) are
the same up to the last question; under `last_turn` the source answers count too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dagster_project.conversations.shards import PolicyCounts, SourceTotals
from dagster_project.tokenizer import load_tokenizer, render_prompt_ids
from tests.support.ingest_helpers import run_stages
from tests.support.paths import SHARED_DATA, require_shared


@pytest.fixture(autouse=True, scope="module")
def shared_data() -> Path:  # module scope: checked before the module's other fixtures read the files
    return require_shared("data")


FASTCHAT = SHARED_DATA / "FastChat" / "dummy_conversation.json"
ALPACA = SHARED_DATA / "LLaMA-Factory" / "alpaca_en_demo.json"
KTO = SHARED_DATA / "LLaMA-Factory" / "kto_en_demo.json"


def first_occurrences(keys: list[object]) -> set[int]:
    seen: set[object] = set()
    first = set()
    for index, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            first.add(index)
    return first


def up_to_last_question(messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last = max(i for i, (role, _) in enumerate(messages) if role == "user")
    return messages[: last + 1]


def request_keys(messages_per_row: list[list[tuple[str, str]]], show_answers: bool) -> list[object]:
    return [
        tuple(
            (role, text if show_answers or role != "assistant" else "") for role, text in up_to_last_question(messages)
        )
        for messages in messages_per_row
    ]


def fastchat_messages() -> list[list[tuple[str, str]]]:
    roles = {"human": "user", "gpt": "assistant"}
    return [[(roles[m["from"]], m["value"]) for m in row["conversations"]] for row in json.loads(FASTCHAT.read_text())]


def kto_messages() -> list[list[tuple[str, str]]]:
    return [[(m["role"], m["content"]) for m in row["messages"]] for row in json.loads(KTO.read_text())]


@pytest.fixture(scope="module")
def all_turns(tmp_path_factory: pytest.TempPathFactory):
    return run_stages(tmp_path_factory.mktemp("samples"), [str(FASTCHAT), str(ALPACA), f"kto={KTO}"], num_shards=4)


def test_every_sample_row_is_a_conversation_or_quarantined(all_turns) -> None:
    outcomes = all_turns.by_row()
    for path, count in [(FASTCHAT, 500), (ALPACA, 999), (KTO, 300)]:
        assert sorted(row for file, row in outcomes if file == str(path)) == list(range(count)), path
    manifest = all_turns.manifest
    assert manifest.input_rows == 1799 == manifest.rows + manifest.quarantined


def test_sharegpt_duplicates_are_the_repeated_question_sequences(all_turns) -> None:
    kept = first_occurrences(request_keys(fastchat_messages(), show_answers=False))
    rows = all_turns.by_row()
    assert {row for (file, row), outcome in rows.items() if file == str(FASTCHAT) and outcome == "kept"} == kept
    assert {outcome for (file, _), outcome in rows.items() if file == str(FASTCHAT)} == {"kept", "duplicate"}
    kept_ids = {c.id for c in all_turns.conversations if c.source == "dummy_conversation"}
    assert kept_ids == {f"identity_{row}" for row in kept}, "ShareGPT ids are the source's own"
    assert all_turns.manifest.by_source["dummy_conversation"] == SourceTotals(
        input_rows=500,
        conversations=len(kept),
        quarantined=500 - len(kept),
        quarantined_by_reason={"duplicate": 500 - len(kept)},
        duplicates=500 - len(kept),  # counted on their own: exact duplicates are not bad rows
    )


def test_alpaca_keeps_the_first_of_each_exact_duplicate_and_hashes_ids(all_turns) -> None:
    rows = json.loads(ALPACA.read_text())
    kept = first_occurrences([(r["instruction"], r["input"]) for r in rows])
    assert len(rows) - len(kept) == 14  # PROVENANCE.md: 14 exact duplicates
    outcomes = all_turns.by_row()
    assert {row for (file, row), outcome in outcomes.items() if file == str(ALPACA) and outcome == "kept"} == kept
    alpaca = {c.source_row: c for c in all_turns.conversations if c.source == "alpaca_en_demo"}
    assert all(c.id.startswith("h-") and c.extra["source_id"] is None for c in alpaca.values())
    with_input = next(i for i in sorted(kept) if rows[i]["input"])
    assert (
        alpaca[with_input].messages[0]["content"] == f"{rows[with_input]['instruction']}\n\n{rows[with_input]['input']}"
    )
    without_input = next(i for i in sorted(kept) if not rows[i]["input"])
    assert alpaca[without_input].messages[0]["content"] == rows[without_input]["instruction"]


def test_openai_messages_keep_their_answers_as_reference_and_count_turns(all_turns) -> None:
    kept = first_occurrences(request_keys(kto_messages(), show_answers=False))
    kto = {c.source_row: c for c in all_turns.conversations if c.source == "kto"}
    assert set(kto) == kept
    messages = kto_messages()
    for row, conversation in kto.items():
        assert [(m["role"], m["content"]) for m in conversation.messages] == messages[row]
        assert conversation.num_turns == sum(role == "user" for role, _ in messages[row])  # strict alternation here
    assert all_turns.manifest.multi_turn == sum(c.extra["source_user_turns"] > 1 for c in all_turns.conversations)


def test_last_turn_counts_the_source_answers_as_part_of_the_request(tmp_path: Path) -> None:
    outcome = run_stages(tmp_path, [str(FASTCHAT)], policy="last_turn")
    kept = first_occurrences(request_keys(fastchat_messages(), show_answers=True))
    assert {c.source_row for c in outcome.conversations} == kept
    assert all(c.history == "source" and c.num_turns == 1 for c in outcome.conversations)
    assert outcome.manifest.by_policy == {
        "last_turn": PolicyCounts(conversations=len(kept), multi_turn=outcome.manifest.multi_turn, turns=len(kept))
    }


def test_token_budget_matches_the_real_tokenizer_row_by_row(tmp_path: Path) -> None:
    budget = 150  # about half of these prompts are longer
    outcome = run_stages(tmp_path, [f"kto={KTO}"], max_prompt_tokens=budget)
    tokenizer = load_tokenizer()
    counted = 0
    for row, messages in enumerate(kto_messages()):
        prompt = [{"role": role, "content": text} for role, text in up_to_last_question(messages)]
        expected = "too_long" if len(render_prompt_ids(tokenizer, prompt)) > budget else "kept"
        actual = outcome.by_row()[(str(KTO), row)]
        if actual != "duplicate":
            assert actual == expected, f"row {row}"
            counted += 1
    assert counted > 250 and 0 < outcome.manifest.quarantined_by_reason["too_long"] < counted
    assert outcome.manifest.prompts_tokenized < 270, "short prompts are decided without the tokenizer"
