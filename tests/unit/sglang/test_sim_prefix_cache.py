from __future__ import annotations

from dagster_project.sglang.sim.prefix_cache import BLOCK_TOKENS, PrefixCache


def test_a_repeated_prompt_is_found_to_its_last_token_and_an_unknown_one_not_at_all():
    cache = PrefixCache()
    prompt = list(range(1, 22))
    assert cache.match(prompt) == 0
    cache.insert(prompt, [7, 7, 7])
    assert cache.match(prompt) == len(prompt) - 1  # the last token is always computed, as SGLang's
    assert cache.match([99, *prompt]) == 0


def test_a_conversation_that_goes_on_is_found_to_the_last_block_it_shares():
    cache = PrefixCache()
    prompt, answer = list(range(100)), list(range(1000, 1050))
    cache.insert(prompt, answer)
    follow_up = [*prompt, *answer, 5, 6, 7]
    assert cache.match(follow_up) == (len(prompt) + len(answer)) // BLOCK_TOKENS * BLOCK_TOKENS


def test_the_cache_forgets_the_least_recently_used_prefixes_first():
    cache = PrefixCache(limit=2)
    cache.insert([1, 2, 3], [])  # one digest: of [1, 2] (the answer adds none)
    cache.insert([4, 5, 6], [])
    assert cache.match([1, 2, 3]) == 2  # now the most recently used
    cache.insert([7, 8, 9], [])
    assert cache.match([4, 5, 6]) == 0 and cache.match([1, 2, 3]) == 2 and cache.match([7, 8, 9]) == 2
