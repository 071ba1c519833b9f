"""Quality gates: the historical "loss_mask sum = 6" shard is blocked, a healthy one passes, every rule has an edge."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dagster_project.records import COMPLETION_SCHEMA
from dagster_project.tokenizer import load_tokenizer, render_prompt_ids, special_ids, tokenizer_profile
from dagster_project.tool_calls import render_call
from dagster_project.training import distribution_gates, gate_result, gates, output_profile, row_figures, row_gates
from dagster_project.training.evidence import percent, weigh
from dagster_project.training.lengths import TRUNCATE
from dagster_project.training.stage import AssemblyOptions, assemble_batch
from dagster_project.training.tool_call_gate import malformed_tool_calls
from tests.support.model_families import DEEPSEEK, MISTRAL, QWEN3, QWEN3_6, family_tokenizer
from tests.support.training_shards import (
    disaster_rows,
    error_row,
    healthy_output,
    healthy_rows,
    output_ids,
    question,
    templated_rows,
    tokenizer,
)


def _training_batch(rows: list[dict], options: AssemblyOptions | None = None) -> pa.RecordBatch:
    completions = pa.RecordBatch.from_pylist(rows, schema=COMPLETION_SCHEMA)
    batch, _ = assemble_batch(completions, 0, options or AssemblyOptions(), set())
    return batch


def _evaluate(rows: list[dict], **kwargs) -> dict[str, gate_result.GateResult]:
    tok = tokenizer()
    special = special_ids(tok)
    profile = gates.profile_training_batches([_training_batch(rows)], special, tok.decode)
    results = gates.shard_gates(profile, vocab_size=special.vocab_size, enable_thinking=True, **kwargs)
    return {result.name: result for result in results}


def test_the_historical_failure_is_blocked_with_messages_a_person_understands():
    results = _evaluate(disaster_rows(100, broken_share=0.87))

    concentration = results["loss_sum_concentration"]
    assert not concentration.passed
    assert concentration.message.startswith("BLOCKED: 87% of rows (87/100) have loss_mask sum exactly 6")
    assert "empty reasoning + a one-word answer such as 'OK.'" in concentration.message
    assert concentration.metadata["top_sum"] == 6 and concentration.metadata["top_count"] == 87

    floor = results["loss_sum_floor"]
    assert not floor.passed
    assert floor.message.startswith("BLOCKED: 87% of rows (87/100) have fewer than 32 supervised tokens")

    thinking = results["thinking_structure"]
    assert not thinking.passed
    assert "87% of finished answers (87/100) have empty reasoning before </think>" in thinking.message

    degenerate = results["degenerate_answers"]
    assert not degenerate.passed
    assert "87% of distinct prompts (87/100) got the same answer 'OK.'" in degenerate.message

    short = results["short_answers"]
    assert not short.passed and "most often 'OK.'" in short.message

    # Six supervised tokens still hold DFlash anchors and valid ids: those gates rightly stay green.
    assert results["consecutive_supervised"].passed and results["ids_in_vocabulary"].passed


def test_a_healthy_shard_passes_every_gate():
    results = _evaluate(healthy_rows(60))
    assert all(result.passed for result in results.values()), {r.name: r.message for r in results.values()}
    assert all(result.message.startswith("ok: ") for result in results.values())


def test_one_output_shape_repeated_fails_the_concentration_gate_alone():
    results = _evaluate(templated_rows(30, templated=15))
    assert {r.name: r.message for r in results.values() if not r.passed} == {
        "loss_sum_concentration": "BLOCKED: 50% of rows (15/30) have loss_mask sum exactly 40 — "
        "one output shape repeated across the shard; limit 5%; true share at least 14.6% (false-block rate 1 in 10,000)"
    }


def test_the_historical_failure_blocks_every_answer_gate_from_20_rows():
    """20 rows is the smallest shard the seed's failure must block; with fewer rows of it, the share that blocks only
    falls as shards grow (`test_the_seeds_share_is_evidence_at_every_size_from_20_rows`)."""
    results = _evaluate(disaster_rows(20))
    blocked = {name for name, result in results.items() if not result.passed}
    assert blocked == {"loss_sum_floor", "loss_sum_concentration", "thinking_structure", "degenerate_answers"} | {
        "short_answers"
    }, {r.name: r.message for r in results.values()}


def test_the_seeds_share_is_evidence_at_every_size_from_20_rows():
    # Each answer gate's blocking count stays under 60% of the rows at every size (the seed: 87%), so even an
    # unlucky 20-row shard of it (60% of 20 or more broken, with probability 1 - 1e-4) is blocked.
    limits = gates.GateThresholds()
    for total in [*range(20, 301), 500, 1000, 5000]:
        weighed = [
            weigh(0, total, limits.max_share_below_floor),
            weigh(0, total, limits.max_bad_thinking_share),
            weigh(0, total, limits.max_short_answer_share),
            weigh(0, total, limits.max_top_loss_sum_share, among_many=True, min_count=limits.min_repeats),
            weigh(0, total, limits.max_degenerate_share, among_many=True, min_count=limits.min_repeats),
        ]
        assert max(w.blocks_from for w in weighed) <= 0.6 * total, total


def test_a_few_broken_rows_in_a_large_shard_do_not_block_it():
    # 2 of 100 under the floor is within the default 2% limit; the same 2 can never dominate the sums.
    results = _evaluate(disaster_rows(100, broken_share=0.02))
    assert results["loss_sum_floor"].passed and results["loss_sum_concentration"].passed


def test_loss_floor_blocks_on_evidence_that_the_share_exceeds_its_limit():
    """Over the limit by chance is not enough: at 100 rows and a 2% limit, 10 rows below the floor block and 9 do
    not (a healthy shard at 2% shows 10 once in ~30,000)."""
    sums = np.array([10] * 9 + [500 + i for i in range(91)])
    passed = distribution_gates.loss_sum_floor(sums)
    assert passed.passed and passed.metadata["blocks_from"] == 10
    assert passed.message == (
        "ok: 9% of rows (9/100) have fewer than 32 supervised tokens (median 540); limit 2%; of 100 rows, 10 would "
        "block (false-block rate 1 in 10,000)"
    )
    blocked = distribution_gates.loss_sum_floor(np.append(sums[:99], 5))
    assert not blocked.passed and blocked.metadata["true_share_lower_bound"] > 0.02
    assert blocked.message.startswith("BLOCKED: 10% of rows (10/100) have fewer than 32 supervised tokens")
    assert distribution_gates.loss_sum_floor(sums, floor=8).metadata["rows_below_floor"] == 0
    empty = distribution_gates.loss_sum_floor(np.array([], dtype=np.int64))
    assert not empty.passed and empty.message == "BLOCKED: the shard has no rows"


def _sums(top: int, rows: int) -> np.ndarray:
    """`rows` loss_mask sums, `top` of them 700 and every other one distinct."""
    return np.array([700] * top + list(range(800, 800 + rows - top)))


def test_loss_sum_concentration_blocks_from_the_count_that_is_evidence_among_every_sum():
    assert distribution_gates.loss_sum_concentration(_sums(4, 10)).passed  # 40%, but 4 of 10 is too few to be evidence
    # At 64 rows, 5 on one sum (8%, over the 5% limit) is chance; among every sum that could be top, 14 is not.
    assert distribution_gates.loss_sum_concentration(_sums(5, 64)).passed
    assert distribution_gates.loss_sum_concentration(_sums(13, 64)).passed
    blocked = distribution_gates.loss_sum_concentration(_sums(14, 64))
    assert not blocked.passed and blocked.metadata["blocks_from"] == 14 and blocked.metadata["top_sums"]["700"] == 14
    assert blocked.message == (
        "BLOCKED: 22% of rows (14/64) have loss_mask sum exactly 700 — one output shape repeated across the shard; "
        f"limit 5%; true share at least {percent(blocked.metadata['true_share_lower_bound'])} (false-block rate 1 in "
        "10,000)"
    )


def test_loss_sum_concentration_never_blocks_under_min_repeats_rows():
    """The repeats boundary: a sum seen exactly `min_repeats` times, with strong evidence beyond the share, blocks;
    one time fewer does not (here `min_repeats` 20 is above the 14 the evidence alone needs at 64 rows)."""
    assert distribution_gates.loss_sum_concentration(_sums(19, 64), min_repeats=20).passed
    blocked = distribution_gates.loss_sum_concentration(_sums(20, 64), min_repeats=20)
    assert not blocked.passed and blocked.metadata["blocks_from"] == 20
    assert not distribution_gates.loss_sum_concentration(
        _sums(19, 64)
    ).passed  # at the default 5, evidence alone decides


def test_consecutive_supervised_pairs_never_straddle_rows():
    masks = pa.array([[0, 0, 1, 0, 1], [0, 1], [1, 0, 0], [0, 1, 1, 1], []], pa.list_(pa.int8()))
    assert row_figures.supervised_pairs(masks).tolist() == [0, 0, 0, 2, 0]
    result = row_gates.consecutive_supervised(row_figures.supervised_pairs(masks))
    assert not result.passed
    assert result.message.startswith("BLOCKED: 4/5 rows have fewer than 1 pair(s) of consecutive supervised tokens")
    assert result.metadata["sample_rows"] == [0, 1, 2, 4]


def test_per_row_figures_read_sliced_and_chunked_columns():
    lists = pa.array([[9, 9], [1, 2, 3], [], [7], [4, 1, 1, 1]], pa.list_(pa.int32()))
    chunked = pa.chunked_array([lists.slice(1, 2), lists.slice(3)])
    assert row_figures.list_lengths(chunked).tolist() == [3, 0, 1, 4]
    assert row_figures.row_sums(chunked).tolist() == [6, 0, 7, 7]
    low, high = row_figures.id_bounds(chunked)
    assert low.tolist() == [1, 0, 7, 1] and high.tolist() == [3, -1, 7, 4]
    prompts, supervised = row_figures.split_by_mask(
        lists.slice(1), pa.array([[0, 1, 1], [], [1], [0, 0, 1, 1]], pa.list_(pa.int8()))
    )
    assert prompts.to_pylist() == [[1], [], [], [4, 1]]
    assert supervised.to_pylist() == [[2, 3], [], [7], [1, 1]]


def test_ids_outside_the_vocabulary_are_named():
    vocab = special_ids(tokenizer()).vocab_size
    low, high = row_figures.id_bounds(pa.array([[1, 2], [3, vocab], [-1, 5]], pa.list_(pa.int32())))
    result = row_gates.ids_in_vocabulary(low, high, vocab)
    assert not result.passed
    assert result.message == (
        f"BLOCKED: 2/3 rows hold ids outside [0, {vocab}) (smallest -1, largest {vocab}) "
        "— wrong tokenizer or corrupted rows"
    )
    assert row_gates.ids_in_vocabulary(np.array([0]), np.array([vocab - 1]), vocab).passed


def _thinking(outputs: list[list[int]], finished: list[bool] | None = None, **kwargs) -> gate_result.GateResult:
    tok = tokenizer()
    profile = output_profile.profile_outputs(pa.array(outputs, pa.list_(pa.int32())), special_ids(tok), tok.decode)
    return distribution_gates.thinking_structure(
        profile, np.array(finished or [True] * len(outputs)), max_bad_share=0.0, **kwargs
    )


def test_thinking_structure_names_each_way_an_answer_can_be_malformed():
    tok = tokenizer()
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    good = output_ids("Two plus two is four.", "4")
    assert _thinking([good]).passed
    cases = {
        "no_think_end": encode("Just an answer without reasoning.<|im_end|>"),
        "several_think_ends": encode("Hmm.\n</think>\n\nMaybe.\n</think>\n\nYes.<|im_end|>"),
        "stray_think_start": encode("<think>\nAgain.\n</think>\n\nYes.<|im_end|>"),
        "blank_reasoning": encode("\n \n</think>\n\nYes.<|im_end|>"),
    }
    for problem, output in cases.items():
        result = _thinking([good, output])
        assert not result.passed and result.metadata[problem] == 1, (problem, result.message)
    assert "never close the think block" in _thinking([cases["no_think_end"]]).message
    # A truncated or length-capped answer may stop inside its reasoning: it is not judged.
    assert _thinking([good, cases["no_think_end"]], finished=[True, False]).passed
    # Thinking off: the prompt closed the block, so any marker in the answer is wrong.
    off = _thinking([encode("Plain answer.<|im_end|>"), good], enable_thinking=False)
    assert not off.passed and off.metadata["think_end_with_thinking_off"] == 1


def test_thinking_profile_reads_completions_output_ids_too():
    tok = tokenizer()
    capped = output_ids("Long reasoning", "unused")[:3]  # a length-capped answer, still inside its reasoning
    profile = output_profile.profile_outputs([healthy_output(3), capped], special_ids(tok), tok.decode)
    assert profile.think_ends.tolist() == [1, 0]
    assert profile.answer_texts[0] == "3 times 6 is 18."
    assert profile.answer_texts[1] == tok.decode(capped).strip()  # no </think>: the whole output is the answer


def test_the_same_answer_to_the_same_prompt_is_not_degenerate():
    prompts = [b"p1"] * 6 + [b"p2", b"p3", b"p4"]
    assert distribution_gates.degenerate_answers(["Paris."] * 6 + ["a", "b", "c"], prompts).passed
    result = distribution_gates.degenerate_answers(["Paris."] * 6 + ["Paris."] * 3, prompts)
    assert result.passed  # 4 distinct prompts: fewer than min_repeats (5)
    prompts = [bytes([i]) for i in range(10)]
    spread = distribution_gates.degenerate_answers(["OK."] * 6 + list("abcd"), prompts)
    assert not spread.passed and spread.metadata["top_answer_prompts"] == 6 and spread.metadata["blocks_from"] == 6
    assert distribution_gates.degenerate_answers(["OK."] * 5 + list("abcde"), prompts).passed  # 5 of 10 could be chance


def test_short_answers_separate_empty_from_short():
    answers = ["A complete sentence."] * 90 + [""] * 7 + ["4"] * 3
    result = distribution_gates.short_answers(answers)
    assert not result.passed and "7% of finished answers (7/100) are empty after </think>" in result.message
    assert result.metadata["empty_blocks_from"] == 7 and result.metadata["short_blocks_from"] == 24
    assert distribution_gates.short_answers(answers, max_empty_share=0.02).passed  # 7 of 100 at 2%: 10 would block
    assert distribution_gates.short_answers(
        answers[:96] + answers[97:]
    ).passed  # 6 empty of 99: over 1%, not evidence of it
    assert result.metadata["short_answers"] == 10 and result.metadata["common_short_answers"] == {"": 7, "4": 3}


def _profile(rows: list[dict], options: AssemblyOptions | None = None) -> gates.ShardProfile:
    tok = tokenizer()
    return gates.profile_training_batches([_training_batch(rows, options)], special_ids(tok), tok.decode)


def _completions(rows: list[dict]) -> list[pa.RecordBatch]:
    return pa.Table.from_pylist(rows, schema=COMPLETION_SCHEMA).to_batches(max_chunksize=3)


def test_training_rows_equal_the_completions_ids():
    rows = healthy_rows(8)
    assert row_gates.ids_match_completions(_profile(rows).digests, _completions(rows)).passed
    truncated = _profile(rows, AssemblyOptions(max_length=60, length_policy=TRUNCATE))
    assert row_gates.ids_match_completions(truncated.digests, _completions(rows)).passed  # a prefix of the output


@pytest.mark.parametrize(
    ("tamper", "problem"),
    [
        (lambda row: row.update(output_ids=[row["output_ids"][0] + 1, *row["output_ids"][1:]]), "output_differs"),
        (lambda row: row.update(prompt_ids=row["prompt_ids"][1:]), "prompt_differs"),
        (lambda row: row.update(event_id="elsewhere#turn0"), "not_in_completions"),
    ],
)
def test_a_row_that_differs_from_its_completion_is_blocked(tamper, problem):
    rows = healthy_rows(5)
    training_source = [dict(row) for row in rows]
    tamper(training_source[2])
    result = row_gates.ids_match_completions(_profile(training_source).digests, _completions(rows))
    assert not result.passed and result.metadata[problem] == 1, result.message
    assert result.message.startswith("BLOCKED: 1/5 rows ")


def test_a_mask_that_is_not_the_engine_boundary_is_blocked():
    rows = healthy_rows(3)
    batch = _training_batch(rows)
    masks = batch.column("loss_mask").to_pylist()
    masks[1][-1] = 0  # EOS unsupervised: the mask no longer ends at the output's end
    batch = batch.set_column(5, "loss_mask", pa.array(masks, pa.list_(pa.int8())))
    tok = tokenizer()
    profile = gates.profile_training_batches([batch], special_ids(tok), tok.decode)
    result = row_gates.ids_match_completions(profile.digests, _completions(rows))
    assert not result.passed and result.metadata["mask_not_at_boundary"] == 1


def test_row_digests_distinguish_token_sequences():
    tok = tokenizer()
    keys = row_figures.row_digests([render_prompt_ids(tok, question(i)) for i in (1, 2, 1)])
    assert keys[0] == keys[2] != keys[1]


def test_the_same_gates_block_the_failure_on_completions_before_any_training_row_exists():
    tok = tokenizer()
    special = special_ids(tok)
    rows = disaster_rows(100) + [error_row("failed#turn0", [1, 2, 3])]
    batches = pa.Table.from_pylist(rows, schema=COMPLETION_SCHEMA).to_batches(max_chunksize=16)
    profile = gates.profile_completion_batches(batches, special, tok.decode)
    results = {r.name: r for r in gates.shard_gates(profile, vocab_size=special.vocab_size, enable_thinking=True)}
    assert len(profile.loss_sums) == 100  # the error row has no answer to judge
    assert results["loss_sum_concentration"].message.startswith(
        "BLOCKED: 87% of rows (87/100) have loss_mask sum exactly 6"
    )
    assert {name for name, r in results.items() if not r.passed} == {
        "loss_sum_floor",
        "loss_sum_concentration",
        "thinking_structure",
        "degenerate_answers",
        "short_answers",
    }
    healthy = gates.profile_completion_batches(
        pa.Table.from_pylist(healthy_rows(30), schema=COMPLETION_SCHEMA).to_batches(), special, tok.decode
    )
    assert all(r.passed for r in gates.shard_gates(healthy, vocab_size=special.vocab_size, enable_thinking=True))


def test_malformed_generated_tool_calls_block_above_their_share():
    """The gate counts calls, not rows, in finished answers only: one malformed call of twenty passes at 5%."""
    good = render_call("get_time", {})
    broken = render_call("get_weather", {"city": "Lyon"}).replace("</function>\n", "")
    answers = [good] * 18 + [f"{good}\n{broken}", broken, "Plain answer."]
    finished = np.array([True] * 19 + [False, True])
    result = malformed_tool_calls(answers, finished, max_share=0.05)
    assert result.passed and result.metadata["tool_calls"] == 20 and result.metadata["malformed_tool_calls"] == 1
    assert result.message == (
        "ok: 1/20 generated tool calls malformed (5.0%); limit 5%; of 20 calls, 7 would block "
        "(false-block rate 1 in 10,000)"
    )
    worse = [*answers[:-1], *[broken] * 6, "Plain answer."]  # 8 malformed of 27 calls, all finished
    blocked = malformed_tool_calls(worse, np.ones(len(worse), dtype=bool), max_share=0.05)
    assert not blocked.passed and blocked.metadata["malformed_tool_calls"] == 8 == blocked.metadata["blocks_from"]
    assert malformed_tool_calls(worse[:-2] + worse[-1:], np.ones(len(worse) - 1, dtype=bool)).passed  # 7 of 26
    assert blocked.metadata["sample_rows"] == [18, 19, 20, 21, 22]
    assert malformed_tool_calls(["Plain answer."], np.array([True])).passed


# A call as Qwen3's template writes one (hermes JSON inside the same tags as Qwen3.6's XML form).
QWEN3_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'


@pytest.mark.parametrize("family", [QWEN3_6, QWEN3, DEEPSEEK, MISTRAL])
def test_tool_calls_are_judged_only_in_the_form_the_gate_reads(family: str) -> None:
    """The profile reads the form off the template's render of a call: Qwen3.6's `<tool_call>` blocks are judged;
    Qwen3's JSON ones (the same `<tool_call>` tags) would all read as malformed, DeepSeek's and Mistral's not at
    all, so their calls are not judged and the gate says so."""
    tok = load_tokenizer(family_tokenizer(family))
    known = tokenizer_profile(tok).tool_calls_known
    assert known == (family == QWEN3_6)
    answers = [f"Checking.\n\n{QWEN3_CALL}"] * 20  # well-formed calls as Qwen3 writes them
    result = malformed_tool_calls(answers, np.ones(20, dtype=bool), calls_known=known)
    if known:
        assert not result.passed and result.metadata["malformed_tool_calls"] == 20  # not Qwen3.6's form
        return
    assert result.passed and result.metadata == {"calls_known": False, "not_judged_answers": 20,
                                                  "max_malformed_share": 0.05}  # fmt: skip
    assert result.message == (
        "ok: not judged: the model's chat template writes tool calls in another form than Qwen3.6's <tool_call>, "
        "the only one this gate reads (20 finished answers not read)"
    )


def test_error_and_length_capped_shares_block_on_evidence_too():
    from dagster_project.training.gate_sets import share_gate

    # 3 errors of 64 events (4.7%) is over the 2% limit by chance; 8 is evidence.
    assert share_gate("error_rate", 3, 64, 0.02, "ended in an error", {"timeout": 3}).passed
    blocked = share_gate("error_rate", 8, 64, 0.02, "ended in an error", {"timeout": 8})
    assert not blocked.passed and blocked.metadata["blocks_from"] == 8
    assert blocked.message.startswith(
        "BLOCKED: 12.5% of events (8/64) ended in an error (limit 2%; true share at least 2."
    ) and blocked.message.endswith("(false-block rate 1 in 10,000)); by kind {'timeout': 8}")


def test_a_caller_sets_the_false_block_rate_of_everyshare_gate():
    """The watch weighs its own looks: the rate it passes reaches every gate that decides on evidence."""
    rows = disaster_rows(64, broken_share=0.05)  # 3 of 64: over the floor's and thinking's limits, by chance
    assert all(result.passed for result in _evaluate(rows).values())
    lenient = _evaluate(rows, false_block_rate=0.2)
    assert not lenient["thinking_structure"].passed and not lenient["loss_sum_floor"].passed
    deciding = ("loss_sum_floor", "loss_sum_concentration", "thinking_structure", "degenerate_answers")
    assert {lenient[name].metadata["false_block_rate"] for name in deciding} == {0.2}
    assert lenient["short_answers"].metadata["short_false_block_rate"] == 0.2
