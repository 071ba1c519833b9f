"""Our loss-mask convention next to SpecForge's golden files (../shared/data/SpecForge, Qwen3.5 tokenizer,
same ids as Qwen3.6 for every token here), and exactly where the two differ.

SpecForge renders a finished conversation and supervises, by regex, from after
`<|im_start|>assistant\\n<think>\\n` through `<|im_end|>\\n`. We take the boundary from the engine: the
prompt is what was sent (ending in `<think>\\n`), the supervised part is exactly what the model returned
(ending in `<|im_end|>`). The differences, each asserted below:

1. **The trailing "\\n".** SpecForge supervises the "\\n" after `<|im_end|>`; the model stops at `<|im_end|>`
   and never generates it, so our rows end one token earlier.
2. **The boundary token** (empty reasoning only). Rendered whole, `<think>\\n\\n</think>` tokenizes the two
   newlines as one token (271), which SpecForge leaves unsupervised. At the engine boundary the prompt
   ends in "\\n" (198) and the model emits its own "\\n" (198) before `</think>`: same text, one more
   supervised token. With non-empty reasoning the boundaries coincide.
3. **Historical turns.** SpecForge packs a conversation into one row and supervises only turns the template
   renders with a think block (after the last user message); earlier assistant turns get mask 0. We emit
   one row per generation event, each with its own prompt, so every regenerated turn is supervised once.

Net effect on the sums: the standard file has 9 supervised tokens in both conventions (SpecForge: `</think>`
+ "\\n\\n" + 5 answer tokens + `<|im_end|>` + "\\n"; ours: "\\n" + `</think>` + "\\n\\n" + 5 + `<|im_end|>`).
The historical "sum = 6" failure reads 6 in both too (empty reasoning + "OK.").
"""

from __future__ import annotations

import json

import pyarrow as pa

from dagster_project.records import COMPLETION_SCHEMA
from dagster_project.tokenizer import render_prompt_ids, special_ids
from dagster_project.training.stage import AssemblyOptions, assemble_batch
from tests.support.paths import require_shared
from tests.support.training_shards import DISASTER_OUTPUT_TEXT, completion_row, tokenizer

NEWLINE, DOUBLE_NEWLINE = 198, 271


def _golden(name: str) -> tuple[list[int], list[int]]:
    record = json.loads(require_shared("data", "SpecForge", name).read_text())
    return record["input_ids"], record["loss_mask"]


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for position, value in enumerate([*mask, 0]):
        if value and start is None:
            start = position
        elif not value and start is not None:
            spans.append((start, position))
            start = None
    return spans


def _our_row(prompt_ids: list[int], output: list[int]) -> dict:
    rows = [completion_row("golden#turn0", prompt_ids, output)]
    batch, _ = assemble_batch(pa.RecordBatch.from_pylist(rows, schema=COMPLETION_SCHEMA), 0, AssemblyOptions(), set())
    return batch.to_pylist()[0]


def test_standard_golden_against_our_engine_boundary():
    tok = tokenizer()
    special = special_ids(tok)
    golden_ids, golden_mask = _golden("qwen3.5_standard_ref.json")
    history = [
        {"role": "user", "content": "Who are you?"},
        {"role": "assistant", "content": "My name is Qwen2."},
        {"role": "user", "content": "How old are you?"},
    ]
    prompt = render_prompt_ids(tok, history)
    # What the model returns after `<think>\n` for empty reasoning and the answer "11 years old.".
    output = tok.encode("\n</think>\n\n11 years old.<|im_end|>", add_special_tokens=False)
    ours = _our_row(prompt, output)

    ((start, end),) = _spans(golden_mask)
    golden_supervised = golden_ids[start:end]
    assert golden_supervised[0] == special.think_end and golden_supervised[-2:] == [special.turn_end, NEWLINE]
    # Same text, minus the "\n" after <|im_end|> (difference 1).
    assert tok.decode(ours["input_ids"]) + "\n" == tok.decode(golden_ids)
    # The prompts agree up to `<think>`; then SpecForge has one "\n\n" token, we have "\n" | "\n" (difference 2).
    assert prompt[:-1] == golden_ids[: start - 1] and golden_ids[start - 1] == DOUBLE_NEWLINE
    assert prompt[-2:] == [special.think_start, NEWLINE]
    supervised = ours["input_ids"][ours["prompt_tokens"] :]
    assert supervised == [NEWLINE, *golden_supervised[:-1]]
    assert sum(ours["loss_mask"]) == sum(golden_mask) == 9
    # The earlier assistant turn is context in both: unsupervised.
    assert not any(golden_mask[: start - 1]) and not any(ours["loss_mask"][: ours["prompt_tokens"]])


def test_multi_turn_golden_becomes_one_row_per_generation_event():
    tok = tokenizer()
    special = special_ids(tok)
    golden_ids, golden_mask = _golden("qwen3.5_multi-turn-tool-calls-with-reasoning_ref.json")
    spans = _spans(golden_mask)
    assert spans == [(217, 320), (401, 444)]
    # SpecForge: of four assistant messages, only the two after the last user message (a tool call, then the
    # answer) are supervised; the two before it are rendered without reasoning and masked 0.
    header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assistant_turns = [i for i in range(len(golden_ids)) if golden_ids[i : i + len(header)] == header]
    assert len(assistant_turns) == 4 and not any(golden_mask[: assistant_turns[2]])

    rows = []
    for start, end in spans:
        # With non-empty reasoning the engine boundary is SpecForge's span start: the prompt ends in `<think>\n`.
        assert golden_ids[start - 2 : start] == [special.think_start, NEWLINE]
        assert golden_ids[end - 2 : end] == [special.turn_end, NEWLINE]
        rows.append(_our_row(golden_ids[:start], golden_ids[start : end - 1]))
    for row, (start, end) in zip(rows, spans, strict=True):
        assert row["input_ids"] == golden_ids[: end - 1]  # the golden up to this turn's <|im_end|>
        assert row["loss_mask"] == [0] * start + [1] * (end - 1 - start)
    # The first turn's output is context in the second row (unsupervised there): it is trained once, in row 1,
    # where SpecForge's single row supervises both turns together.
    assert sum(golden_mask[: spans[1][0]]) == 103 and not any(rows[1]["loss_mask"][: spans[1][0]])
    assert sum(golden_mask) == 146 == sum(sum(row["loss_mask"]) for row in rows) + len(spans)


def test_the_historical_failure_sums_to_6_in_both_conventions():
    tok = tokenizer()
    special = special_ids(tok)
    ours = tok.encode(DISASTER_OUTPUT_TEXT, add_special_tokens=False)
    assert len(ours) == 6 and ours[1] == special.think_end and ours[-1] == special.turn_end
    # SpecForge on the same text: </think>, "\n\n", "OK", ".", <|im_end|>, "\n".
    rendered = tok.encode("<think>\n\n</think>\n\nOK.<|im_end|>\n", add_special_tokens=False)
    assert len(rendered[rendered.index(special.think_end) :]) == 6
