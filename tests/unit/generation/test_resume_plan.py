"""What a resumed shard asks for: a conversation whose journaled turn failed or did not finish ends there.

A later turn's prompt carries the earlier turns' answers; without one there is nothing to build it on, so
the later turns end as errors that say why, and nothing is requested for them. Only a turn that finished
(`stop`, with its visible answer journaled) lets the next one be generated, with that answer in its prompt.
"""

from __future__ import annotations

from dagster_project.generation.events import PREVIOUS_TURN_FAILED, PREVIOUS_TURN_INCOMPLETE, ShardGeneration
from dagster_project.generation.journal import Journal
from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import STATUS_ERROR, STATUS_OK, Conversation

SETTINGS = GenerationSettings()


def two_turns(conversation_id: str) -> Conversation:
    return Conversation(
        id=conversation_id,
        messages=[
            {"role": "user", "content": f"{conversation_id}: first question?"},
            {"role": "assistant", "content": "The source's first answer."},
            {"role": "user", "content": f"{conversation_id}: second question?"},
            {"role": "assistant", "content": "The source's second answer."},
        ],
        generate_after=[0, 2],
    )


def journaled(event_id: str, status: str, **fields) -> dict:
    return {
        "event_id": event_id,
        "status": status,
        "retryable": False,
        "finish_reason": None,
        "history_message": None,
        **fields,
    }


def test_a_journaled_failed_or_unfinished_turn_ends_its_conversation_on_resume(tmp_path, tokenizer):
    failed, unfinished, finished = two_turns("failed"), two_turns("unfinished"), two_turns("finished")
    answer = {"content": "A remembered answer.", "reasoning_content": "Some reasoning."}
    with Journal(tmp_path / "journal.jsonl") as journal:  # what the killed run left
        journal.append(journaled("failed#turn0", STATUS_ERROR, error_kind="bad_response"))
        journal.append(journaled("unfinished#turn0", STATUS_OK, finish_reason="length"))
        journal.append(journaled("finished#turn0", STATUS_OK, finish_reason="stop", history_message=answer))

    with Journal(tmp_path / "journal.jsonl") as journal:
        job = ShardGeneration(0, [failed, unfinished, finished], tokenizer, SETTINGS, journal)
        requests = list(job.initial_requests())

        # Only the conversation whose first turn finished goes on, with that answer in the prompt.
        assert [request.key for request in requests] == ["finished#turn1"]
        assert "A remembered answer." in tokenizer.decode(requests[0].input_ids)
        ended = {event: journal.entries[event] for event in ("failed#turn1", "unfinished#turn1")}
        assert all(entry.final and entry.status == STATUS_ERROR for entry in ended.values())

    records = {record["event_id"]: record for record in journal.final_records()}
    assert records["failed#turn1"]["error_kind"] == PREVIOUS_TURN_FAILED
    assert records["unfinished#turn1"]["error_kind"] == PREVIOUS_TURN_INCOMPLETE
    assert "not generated: turn 0 of this conversation" in records["unfinished#turn1"]["error_message"]


def test_a_tool_conversation_turn_goes_on_after_an_unfinished_turn_on_its_recorded_context(tmp_path, tokenizer):
    """With history `source` a prompt is the recorded calls and results, never the model's answer: a turn that
    did not finish does not hold the next one back, and the next prompt renders the tools and the recorded loop."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lisbon"}}}
    conversation = Conversation(
        id="tool",
        messages=[
            {"role": "user", "content": "Weather in Lisbon?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": '{"temp_c": 21}'},
            {"role": "assistant", "content": "21 degrees."},
        ],
        generate_after=[0, 2],
        history="source",
        tools=tools,
    )
    with Journal(tmp_path / "journal.jsonl") as journal:
        journal.append(journaled("tool#turn0", STATUS_OK, finish_reason="length"))
    with Journal(tmp_path / "journal.jsonl") as journal:
        requests = list(ShardGeneration(0, [conversation], tokenizer, SETTINGS, journal).initial_requests())
    assert [request.key for request in requests] == ["tool#turn1"]
    prompt = tokenizer.decode(requests[0].input_ids)
    assert '"name": "get_weather"' in prompt.split("</tools>")[0]
    assert prompt.endswith(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nLisbon\n</parameter>\n</function>\n</tool_call>"
        '<|im_end|>\n<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n<think>\n"
    )
