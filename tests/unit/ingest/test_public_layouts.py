"""The layouts public prompt sets come in: hh-rlhf transcripts, OpenAssistant trees, Dolly, UltraChat, Chatbot
Arena — detected, read with every turn kept, and never flattened into one message by a column override."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dagster_project.ingest.formats import detect_format, parse_row
from dagster_project.ingest.public_layouts import THREAD_MESSAGES_KEY, TREE_MESSAGES_KEY
from dagster_project.ingest.quarantine import Rejected
from dagster_project.ingest.sources import parse_spec
from tests.support.ingest_helpers import run_stages

HH_ROW = {
    "chosen": "\n\nHuman: What is a good name for a cat?\n\nAssistant: Whiskers is a classic.\n\n"
    "Human: And for a dog?\n\nAssistant: Rex.",
    "rejected": "\n\nHuman: What is a good name for a cat?\n\nAssistant: Whiskers is a classic.\n\n"
    "Human: And for a dog?\n\nAssistant: I don't know.",
}


def oasst_message(role: str, text: str, rank: int | None = None, replies=(), deleted: bool = False) -> dict:
    return {
        "message_id": f"m-{text[:12]}",
        "role": role,
        "text": text,
        "rank": rank,
        "lang": "en",
        "deleted": deleted,
        "replies": list(replies),
    }


OASST_ROOT = oasst_message(
    "prompter",
    "How do plants eat?",
    replies=[
        oasst_message("assistant", "Second best answer.", rank=1),
        oasst_message(
            "assistant",
            "By photosynthesis.",
            rank=0,
            replies=[
                oasst_message(
                    "prompter", "What needs light?", replies=[oasst_message("assistant", "Chlorophyll.", rank=0)]
                ),
                oasst_message("prompter", "A deleted follow-up.", deleted=True),
            ],
        ),
        oasst_message("assistant", "An unranked answer."),
    ],
)


def test_an_hh_rlhf_transcript_is_alternating_turns_with_no_speaker_marker_left() -> None:
    assert detect_format([HH_ROW]) == "hh_rlhf"
    parsed = parse_row(HH_ROW, "hh_rlhf")
    assert parsed.messages == [
        {"role": "user", "content": "What is a good name for a cat?"},
        {"role": "assistant", "content": "Whiskers is a classic."},
        {"role": "user", "content": "And for a dog?"},
        {"role": "assistant", "content": "Rex."},
    ]
    assert not any("Human:" in m["content"] or "Assistant:" in m["content"] for m in parsed.messages)
    assert "rejected" not in parsed.extra


def test_the_rejected_side_is_read_when_the_source_names_it() -> None:
    spec = parse_spec("hh@hh_rlhf:rejected=data/hh.jsonl")
    assert (spec.format, spec.field) == ("hh_rlhf", "rejected")
    parsed = parse_row(HH_ROW, spec.format, spec.field)
    assert parsed.messages[-1] == {"role": "assistant", "content": "I don't know."}


@pytest.mark.parametrize(
    ("transcript", "detail"),
    [
        ("\n\nHuman: one\n\nHuman: two\n\nAssistant: three", "turn 1 is 'Human:'"),
        ("preamble\n\nHuman: hi\n\nAssistant: hello", "does not open on a 'Human:' turn"),
        ("\n\nAssistant: hello\n\nHuman: hi", "turn 0 is 'Assistant:'"),
    ],
)
def test_a_transcript_that_does_not_parse_is_quarantined_with_a_reason(transcript: str, detail: str) -> None:
    with pytest.raises(Rejected) as refused:
        parse_row({"chosen": transcript}, "hh_rlhf")
    assert refused.value.reason == "unparsable_transcript"
    assert detail in refused.value.detail


def test_a_transcript_read_as_a_prompt_column_is_refused_not_flattened() -> None:
    with pytest.raises(Rejected) as refused:
        parse_row(HH_ROW, "prompt", "chosen")
    assert refused.value.reason == "flattened_layout"
    assert "@hh_rlhf" in refused.value.detail


@pytest.mark.parametrize("wrap", [lambda root: root, lambda root: {"message_tree_id": "tree-1", "prompt": root}])
def test_an_openassistant_tree_is_its_top_ranked_thread_with_every_message_counted(wrap) -> None:
    row = wrap(OASST_ROOT)
    assert detect_format([row]) == "oasst"
    parsed = parse_row(row, "oasst")
    assert parsed.messages == [
        {"role": "user", "content": "How do plants eat?"},
        {"role": "assistant", "content": "By photosynthesis."},
        {"role": "user", "content": "What needs light?"},
        {"role": "assistant", "content": "Chlorophyll."},
    ]
    assert parsed.extra[TREE_MESSAGES_KEY] == 7
    assert parsed.extra[THREAD_MESSAGES_KEY] == 4
    assert parsed.source_id in ("tree-1", "m-How do plant")


def test_an_openassistant_tree_read_as_a_prompt_column_is_refused_not_cut_to_its_root() -> None:
    with pytest.raises(Rejected) as refused:
        parse_row(OASST_ROOT, "prompt", "text")
    assert refused.value.reason == "flattened_layout"
    assert "3 replies" in refused.value.detail


def test_an_openassistant_thread_that_starts_with_the_assistant_is_refused() -> None:
    with pytest.raises(Rejected) as refused:
        parse_row(oasst_message("assistant", "orphan", replies=[oasst_message("prompter", "then a user")]), "oasst")
    assert refused.value.reason == "starts_with_assistant"


def test_dolly_reads_its_context_into_the_prompt_and_its_response_as_the_answer() -> None:
    row = {"instruction": "Summarize.", "context": "A long passage.", "response": "Short.", "category": "summarization"}
    assert detect_format([row]) == "alpaca"
    parsed = parse_row(row, "alpaca")
    assert parsed.messages == [
        {"role": "user", "content": "Summarize.\n\nA long passage."},
        {"role": "assistant", "content": "Short."},
    ]
    assert parsed.extra == {"category": "summarization"}


def test_ultrachat_data_is_alternating_user_and_assistant_turns() -> None:
    row = {"id": "7", "data": ["Hi?", "Hello.", "How are you?", "Fine."]}
    assert detect_format([row]) == "ultrachat"
    parsed = parse_row(row, "ultrachat")
    assert [m["role"] for m in parsed.messages] == ["user", "assistant", "user", "assistant"]
    assert parsed.messages[2]["content"] == "How are you?"
    assert parsed.source_id == "7"


def test_chatbot_arena_reads_conversation_a_and_the_other_side_when_named() -> None:
    row = {
        "question_id": "q1",
        "model_a": "alpha",
        "model_b": "beta",
        "conversation_a": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "A says hi"}],
        "conversation_b": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "B says hi"}],
    }
    assert detect_format([row]) == "openai"
    assert parse_row(row, "openai").messages[1]["content"] == "A says hi"
    assert parse_row(row, "openai", "conversation_b").messages[1]["content"] == "B says hi"


def test_lmsys_conversation_is_a_message_list() -> None:
    row = {"conversation_id": "c", "conversation": [{"role": "user", "content": "Hi"}], "model": "m"}
    assert parse_row(row, detect_format([row])).messages == [{"role": "user", "content": "Hi"}]


def test_a_folder_of_public_layouts_accounts_for_every_row(tmp_path: Path) -> None:
    """Through both stages, one file per layout: every row is a conversation or quarantined with its reason; the
    transcripts are multi-turn with no speaker marker left, the OpenAssistant threads keep their later turns."""
    data = tmp_path / "data"
    data.mkdir()
    files = {
        "hh.jsonl": [HH_ROW, {"chosen": "\n\nHuman: a\n\nHuman: b\n\nAssistant: c", "rejected": "x"}],
        "oasst_trees.jsonl": [{"message_tree_id": "tree-1", "prompt": OASST_ROOT}],
        "oasst_messages.jsonl": [OASST_ROOT | {"text": "How do animals eat?"}],
        "dolly.jsonl": [{"instruction": "Summarize.", "context": "A passage.", "response": "Ok.", "category": "x"}],
        "ultrachat.jsonl": [{"id": "u1", "data": ["Hi?", "Hello.", "More?", "Yes."]}],
        "arena.jsonl": [
            {"question_id": "q", "conversation_a": [{"role": "user", "content": "Arena?"}], "conversation_b": []}
        ],
    }
    for name, rows in files.items():
        (data / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    outcome = run_stages(tmp_path, [str(data)])
    by_row = outcome.by_row()
    assert len(by_row) == sum(len(rows) for rows in files.values())
    assert by_row[(str(data / "hh.jsonl"), 1)] == "unparsable_transcript"
    kept = {c.source: c for c in outcome.conversations}
    assert [m["role"] for m in kept["hh"].messages] == ["user", "assistant", "user", "assistant"]
    assert not any("Human:" in m["content"] for c in outcome.conversations for m in c.messages)
    for source in ("oasst_trees", "oasst_messages"):
        assert len(kept[source].messages) == 4
        assert kept[source].extra[TREE_MESSAGES_KEY] == 7
    assert kept["dolly"].messages[0]["content"] == "Summarize.\n\nA passage."
    assert len(kept["ultrachat"].messages) == 4
    assert kept["arena"].messages == [{"role": "user", "content": "Arena?"}]
