"""The token budget's byte bound (tokenizer loaded only near the budget) and the batched dedup index."""

from __future__ import annotations

import itertools

import pytest

from dagster_project.conversations import dedup
from dagster_project.conversations.budget import SCAFFOLD_BYTES_FIXED, SCAFFOLD_BYTES_PER_MESSAGE, PromptBudget
from dagster_project.conversations.dedup import SeenIndex
from dagster_project.tokenizer import load_tokenizer, render_text


def _plain_role_sequences(longest: int):
    """Role sequences of plain prompts: a system message only first, at least one user message."""
    for length in range(1, longest + 1):
        for roles in itertools.product(("system", "user", "assistant"), repeat=length):
            if "user" in roles and "system" not in roles[1:]:
                yield roles


@pytest.mark.parametrize("enable_thinking", [True, False])
@pytest.mark.parametrize("preserve_thinking", [True, False])
def test_the_static_scaffold_bound_covers_the_qwen3_6_template(enable_thinking, preserve_thinking) -> None:
    tokenizer = load_tokenizer()
    for roles in _plain_role_sequences(5):
        empty = [{"role": role, "content": ""} for role in roles]
        flags = {"enable_thinking": enable_thinking, "preserve_thinking": preserve_thinking}
        rendered = len(render_text(tokenizer, empty, add_generation_prompt=True, **flags).encode())
        assert rendered <= SCAFFOLD_BYTES_FIXED + SCAFFOLD_BYTES_PER_MESSAGE * len(roles), roles


def _never_loaded():
    raise AssertionError("the tokenizer was loaded for a prompt far below the budget")


def test_prompts_far_below_the_budget_never_load_the_tokenizer() -> None:
    budget = PromptBudget(_never_loaded, 4096, enable_thinking=True, preserve_thinking=False)
    messages = [{"role": "user", "content": "é" * 1000}, {"role": "assistant", "content": "ok"}]
    assert budget.tokens_over(messages + [{"role": "user", "content": "next"}]) is None
    assert budget.exact_counts == 0


def test_a_prompt_near_the_budget_is_counted_with_the_tokenizer() -> None:
    loads = []

    def load():
        loads.append(1)
        return load_tokenizer()

    budget = PromptBudget(load, 100, enable_thinking=True, preserve_thinking=False)
    assert budget.tokens_over([{"role": "user", "content": "word " * 20}]) is None  # ~30 tokens, 100+ bytes
    over = budget.tokens_over([{"role": "user", "content": "a b c " * 100}])
    assert over.counted and over.tokens > 100
    assert budget.exact_counts == 2 and len(loads) == 1  # loaded once, on the first prompt that needs it


def test_a_prompt_far_over_the_budget_is_refused_on_a_lower_bound_never_tokenized_whole() -> None:
    """8 MB of text: its bytes over the vocabulary's longest token already exceed the budget."""
    budget = PromptBudget(load_tokenizer, 1000, enable_thinking=True, preserve_thinking=False)
    over = budget.tokens_over([{"role": "user", "content": "word " * 1_600_000}])
    assert not over.counted and 1000 < over.tokens < 1_600_000  # a bound: the text is 1.6 M tokens
    assert str(over) == f"at least {over.tokens}"
    longest = max(len(token.encode()) for token in load_tokenizer().get_vocab())
    assert over.tokens >= 8_000_000 // longest


def test_the_batched_index_decides_as_row_by_row_lookups_would(tmp_path) -> None:
    with SeenIndex(tmp_path / "seen") as seen:
        seen.prefetch([1, 2], ["a", "b"])
        assert seen.first_with_content(1) is None
        seen.add_content(1, "a")
        assert seen.claim_id("a") and not seen.claim_id("a")
        assert seen.first_with_content(1) == "a"  # a duplicate within the batch
        seen.commit()
        # The next batch sees the last one's additions on disk; keys it did not prefetch are looked up too.
        seen.prefetch([1], ["a"])
        assert seen.first_with_content(1) == "a" and not seen.claim_id("a")
        assert seen.first_with_content(3) is None and seen.claim_id("c")
        seen.commit()
        assert not seen.claim_id("c")


def test_the_index_answers_alike_across_many_runs_on_disk_and_colliding_id_hashes(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(dedup, "IN_MEMORY_KEYS", 8)  # every merged run goes to disk
    monkeypatch.setattr(dedup, "MAX_MERGED_KEYS", 64)  # and runs stop merging, so several are searched
    monkeypatch.setattr(dedup, "_id_key", lambda row_id: len(row_id))  # ids of one length share a key
    with SeenIndex(tmp_path / "seen") as seen:
        for batch in range(40):
            ids = [f"id-{batch:03d}-{i}" for i in range(5)]
            seen.prefetch(range(batch * 5, batch * 5 + 5), ids)
            for offset, row_id in enumerate(ids):
                assert seen.first_with_content(batch * 5 + offset) is None and seen.claim_id(row_id)
                seen.add_content(batch * 5 + offset, row_id)
            seen.commit()
        assert len(list((tmp_path / "seen").glob("*.npy"))) > 4
        seen.prefetch([7, 199, 200], ["id-001-2", "id-039-4", "id-040-0"])
        assert seen.first_with_content(7) == "id-001-2" and seen.first_with_content(199) == "id-039-4"
        assert seen.first_with_content(200) is None
        assert not seen.claim_id("id-001-2") and not seen.claim_id("id-039-4") and seen.claim_id("id-040-0")
    assert not (tmp_path / "seen").exists()


def test_an_id_read_past_the_end_of_the_ids_file_is_an_error_not_an_endless_read(tmp_path):
    with SeenIndex(tmp_path / "seen") as seen:
        assert seen.claim_id("row-1")
        seen.commit()
        with pytest.raises(RuntimeError, match="ends inside an id"):
            seen._read_id(len(b"row-1") + 1)  # past the only id: nothing ends there
