"""The pilot's sample: every source x turn position x tool use covered, bounded, the same choice every time."""

from __future__ import annotations

import pytest

from dagster_project.pilot.sample import (
    FIRST_TURN,
    LATER_TURN,
    Candidate,
    PilotSampleOptions,
    Stratum,
    choose_sample,
    strata_of,
)
from dagster_project.records import Conversation


def _conversation(cid: str, source: str, turns: int, tools: bool) -> Conversation:
    messages = [{"role": "user", "content": f"q{t}"} for t in range(turns)]
    return Conversation(
        id=cid,
        messages=messages,
        generate_after=list(range(turns)),
        source=source,
        shard=sum(map(ord, cid)) % 7,
        tools=[{"type": "function", "function": {"name": "f"}}] if tools else None,
    )


def _population() -> list[Candidate]:
    """2,000 single-turn chats of one source, and a handful of rare kinds: multi-turn, tools, a small source."""
    common = [_conversation(f"chat{i}", "chats", 1, False) for i in range(2_000)]
    rare = [
        _conversation("multi", "chats", 3, False),
        _conversation("tool", "tools", 1, True),
        _conversation("tool-multi", "tools", 2, True),
        _conversation("alpaca", "alpaca", 1, False),
    ]
    return [Candidate(c.id, c.shard, strata_of(c)) for c in common + rare]


def test_strata_of_a_conversation_are_its_first_and_a_later_turn_with_its_tool_use():
    assert strata_of(_conversation("a", "s", 1, False)) == (Stratum("s", FIRST_TURN, False),)
    assert strata_of(_conversation("b", "s", 4, True)) == (
        Stratum("s", FIRST_TURN, True),
        Stratum("s", LATER_TURN, True),
    )


def test_every_stratum_is_covered_and_the_rest_is_the_share():
    choice = choose_sample(_population(), PilotSampleOptions(share=0.01))
    assert choice.population == 2_004 and choice.target == 21  # ceil(1% of 2,004)
    assert len(choice.ids) == 21
    assert not choice.uncovered
    assert set(choice.strata) == {
        "chats / first turn / no tools",
        "chats / later turn / no tools",
        "tools / first turn / tools",
        "tools / later turn / tools",
        "alpaca / first turn / no tools",
    }
    assert all(count >= 1 for count in choice.strata.values())
    assert {"multi", "tool-multi", "alpaca"} <= set(choice.ids)  # the only members of their strata


def test_min_per_stratum_beyond_the_share_wins_and_max_conversations_bounds_everything():
    generous = choose_sample(_population(), PilotSampleOptions(share=0.0, min_per_stratum=3))
    assert generous.strata["chats / first turn / no tools"] >= 3 and len(generous.ids) <= 3 * 5
    assert generous.strata["alpaca / first turn / no tools"] == 1 and not generous.uncovered  # all there is

    # Three conversations cover all five strata (a multi-turn one covers two); two cannot: the rarest go first.
    assert not choose_sample(_population(), PilotSampleOptions(share=0.5, max_conversations=3)).uncovered
    bounded = choose_sample(_population(), PilotSampleOptions(share=0.5, max_conversations=2))
    assert len(bounded.ids) == 2 and bounded.target == 2
    assert bounded.uncovered == ("tools / first turn / tools", "tools / later turn / tools")


def test_the_choice_is_the_same_whatever_the_order_and_another_seed_draws_another():
    population = _population()
    options = PilotSampleOptions(share=0.05)
    first = choose_sample(population, options)
    assert choose_sample(list(reversed(population)), options) == first
    assert set(choose_sample(population, PilotSampleOptions(share=0.05, seed=1)).ids) != set(first.ids)
    assert first.shards == frozenset(c.shard for c in population if c.id in set(first.ids))


def test_an_empty_population_gives_an_empty_sample():
    choice = choose_sample([], PilotSampleOptions())
    assert choice.ids == () and choice.target == 0 and not choice.strata


@pytest.mark.parametrize("options", [{"share": 1.5}, {"max_conversations": 0}, {"min_per_stratum": -1}])
def test_impossible_sizes_are_refused(options):
    with pytest.raises(ValueError):
        PilotSampleOptions(**options)
