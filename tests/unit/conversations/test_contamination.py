"""Evaluation-set contamination: n-gram overlap after normalization, against the real MT-Bench, HumanEval and
GSM8K files, and the same answers as the plain Python scan."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dagster_project.conversations.contamination import (
    NO_MATCH,
    ContaminationOptions,
    EvalIndex,
    EvalText,
    ascii_words,
    load_eval_texts,
    normalized_words,
    python_grams,
    python_scan,
    python_words,
)
from tests.support.paths import require_shared

EVAL_SETS = ["mt_bench/question.jsonl", "humaneval/HumanEval.jsonl.gz", "gsm8k/test.jsonl"]


@pytest.fixture(scope="module")
def eval_texts() -> list[EvalText]:
    root = require_shared("data/eval_sets")
    return load_eval_texts([str(root / name) for name in EVAL_SETS])


def _mt_bench_question(question_id: int, turn: int = 0) -> str:
    root = require_shared("data/eval_sets")
    for line in (root / "mt_bench/question.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["question_id"] == question_id:
            return record["turns"][turn]
    raise LookupError(question_id)


def test_every_eval_file_is_read(eval_texts):
    per_set = {}
    for text in eval_texts:
        per_set[text.eval_set] = per_set.get(text.eval_set, 0) + 1
    assert per_set == {"mt_bench/question.jsonl": 160, "humaneval/HumanEval.jsonl.gz": 164, "gsm8k/test.jsonl": 1319}


def test_an_mt_bench_question_reworded_only_in_whitespace_and_case_is_caught(eval_texts):
    original = _mt_bench_question(81)
    reworded = "  " + "\n\t".join(word.upper() if i % 2 else word.lower() for i, word in enumerate(original.split()))
    assert reworded != original and reworded.lower().split() == original.lower().split()
    index = EvalIndex(eval_texts)
    hits = index.match([reworded, f"Please help. {reworded} Thanks!", "Compose an engaging travel blog post about."])
    assert hits[0] != NO_MATCH and hits[1] != NO_MATCH and hits[2] == NO_MATCH
    assert (eval_texts[hits[0]].eval_set, eval_texts[hits[0]].item) == ("mt_bench/question.jsonl", "81")


def test_a_short_eval_text_matches_only_a_message_made_of_its_words(eval_texts):
    index = EvalIndex(eval_texts)
    short = next(t for t in eval_texts if 0 < len(python_words(t.text)) < index.ngram)
    hits = index.match([short.text.upper() + " ", f"{short.text} and then tell me a story about dragons"])
    assert eval_texts[hits[0]].text == short.text and hits[1] == NO_MATCH


def test_humaneval_and_gsm8k_prompts_inside_a_longer_message_are_caught(eval_texts):
    index = EvalIndex(eval_texts)
    humaneval = next(t for t in eval_texts if t.eval_set.startswith("humaneval"))
    gsm8k = next(t for t in eval_texts if t.eval_set.startswith("gsm8k"))
    hits = index.match([f"Complete this:\n{humaneval.text}", f"Solve step by step. {gsm8k.text.upper()}"])
    assert [eval_texts[h].item for h in hits] == [humaneval.item, gsm8k.item]


def test_the_vectorized_scan_answers_what_the_plain_python_scan_answers(eval_texts):
    prompts = [t.text for t in eval_texts[::7]] + [
        "What is the capital of France?",
        "",
        "   ",
        "Café au lait — ÉCRIS un poème sur la mer, s'il te plaît, en douze vers réguliers.",
        " ".join(python_words(eval_texts[3].text)[2:12]),
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:",
    ]
    index = EvalIndex(eval_texts)
    vectorized = index.match(prompts).tolist()
    assert [hit != NO_MATCH for hit in vectorized] == [
        hit != NO_MATCH for hit in python_scan(python_grams(eval_texts), prompts)
    ]
    assert sum(hit != NO_MATCH for hit in vectorized) >= len(eval_texts[::7])


def test_normalization_splits_at_anything_but_letters_and_digits():
    texts = ["Hello,   WORLD!\tIt's 42°C", "ﬁne Ｔｅｘｔ", "ÜBER straße"]
    assert normalized_words(texts).to_pylist() == [python_words(text) for text in texts]
    assert python_words(texts[0]) == ["hello", "world", "it", "s", "42", "c"]


def test_the_ascii_fast_path_splits_as_the_general_path():
    texts = ["", "Hello,   WORLD!", "it's_42nd-street", "   ", "x", "trailing words ", "A1b2 C3", "end."]
    words, per_text = ascii_words(pa.array(texts).slice(1))  # a sliced array too
    expected = normalized_words(texts[1:])
    assert per_text.tolist() == [len(w) for w in expected.to_pylist()]
    assert words.to_pylist() == pc.list_flatten(expected).to_pylist()


def test_options_refuse_what_they_cannot_do(tmp_path):
    with pytest.raises(ValueError, match="action must be one of"):
        ContaminationOptions(action="delete")
    with pytest.raises(FileNotFoundError, match="names no readable file"):
        load_eval_texts([str(tmp_path / "missing-*.jsonl")])
    own = tmp_path / "our_eval.txt"
    own.write_text("Explain the rules of cricket to someone who has never seen a match before.\n")
    assert EvalIndex(load_eval_texts([str(own)])).match(["explain the RULES of cricket to someone who has"])[0] == 0
