"""The gates' statistical rule: exact binomial tails, the smallest count that blocks, the bound, and the among-many
correction that lets the most common loss_mask sum or answer be judged whatever the healthy spread."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from dagster_project.training import evidence
from dagster_project.training.evidence import FALSE_BLOCK_RATE, binomial_tail, weigh


def _exact_tail(count: int, total: int, share: Fraction) -> Fraction:
    return sum(
        (math.comb(total, i) * share**i * (1 - share) ** (total - i) for i in range(max(count, 0), total + 1)),
        Fraction(0),
    )


@pytest.mark.parametrize("total", [1, 7, 64, 200])
@pytest.mark.parametrize("share", [Fraction(1, 100), Fraction(1, 20), Fraction(3, 10)])
def test_the_tail_is_the_exact_binomial_sum(total, share):
    for count in sorted({0, 1, 2, total // 20, total // 10, total // 3, total - 1, total}):
        exact = float(_exact_tail(count, total, share))
        assert binomial_tail(count, total, float(share)) == pytest.approx(exact, rel=1e-9, abs=1e-300), count


def test_the_tail_at_the_edges():
    assert binomial_tail(0, 10, 0.3) == 1.0 and binomial_tail(11, 10, 0.3) == 0.0
    assert binomial_tail(1, 10, 0.0) == 0.0 and binomial_tail(10, 10, 1.0) == 1.0
    # A fleet-wide figure, half a million answers (the value scipy.stats.binom.sf gives).
    assert binomial_tail(26_000, 500_000, 0.05) == pytest.approx(5.730154978535e-11, rel=1e-8)


@pytest.mark.parametrize(("total", "limit"), [(20, 0.01), (64, 0.02), (64, 0.05), (500, 0.1), (200, 0.01)])
def test_the_blocking_count_is_the_first_whose_tail_at_the_limit_is_within_the_rate(total, limit):
    first = weigh(0, total, limit).blocks_from
    assert binomial_tail(first, total, limit) <= FALSE_BLOCK_RATE < binomial_tail(first - 1, total, limit)
    assert weigh(first, total, limit).blocks and not weigh(first - 1, total, limit).blocks


def test_a_blocked_share_has_its_lower_bound_above_the_limit_and_a_passed_one_below():
    for count in range(0, 65):
        weighed = weigh(count, 64, 0.05)
        assert (weighed.lower_bound > 0.05) == weighed.blocks, count
        if count:
            assert binomial_tail(count, 64, weighed.lower_bound) == pytest.approx(FALSE_BLOCK_RATE, rel=1e-6)


def test_too_small_a_sample_never_blocks_and_says_so():
    weighed = weigh(3, 3, 0.05)  # 3 of 3 at a 5% limit: 1.25e-4 by chance, over 1 in 10,000
    assert weighed.blocks_from is None and not weighed.blocks
    assert weighed.bound_text("answers") == ("limit 5%; 3 answers are too few to block (false-block rate 1 in 10,000)")
    assert weigh(4, 4, 0.05).blocks
    assert not weigh(0, 0, 0.05).blocks and weigh(0, 0, 0.05).blocks_from is None


def test_limits_at_the_ends_and_a_configured_floor():
    assert weigh(1, 100, 0.0).blocks  # a limit of none: any one blocks
    assert weigh(100, 100, 1.0).blocks_from is None  # a limit of all: nothing blocks
    assert weigh(30, 64, 0.05, min_count=31).blocks_from == 31
    assert not weigh(30, 64, 0.05, min_count=31).blocks and weigh(31, 64, 0.05, min_count=31).blocks
    assert weigh(20, 20, 0.05, min_count=21).blocks_from is None
    with pytest.raises(ValueError, match="false_block_rate"):
        weigh(1, 10, 0.05, false_block_rate=0.0)


def test_a_higher_false_block_rate_blocks_sooner():
    assert weigh(0, 100, 0.02, false_block_rate=0.01).blocks_from < weigh(0, 100, 0.02).blocks_from


def test_the_most_common_of_many_values_pays_for_every_value_that_could_be_top():
    single, many = weigh(0, 64, 0.05), weigh(0, 64, 0.05, among_many=True)
    assert many.test_rate == pytest.approx(FALSE_BLOCK_RATE * 0.05) and many.blocks_from > single.blocks_from
    # The bound behind it: for any spread of true shares none above the limit, the chance that some value reaches
    # the blocking count (at most the sum of each value's tail) stays within the false-block rate.
    rng = random.Random(7)
    for total in (20, 64, 500):
        first = weigh(0, total, 0.05, among_many=True).blocks_from
        for _ in range(200):
            shares, left = [], 1.0
            while left > 1e-9:
                share = min(left, rng.uniform(0, 0.05))
                shares.append(share)
                left -= share
            assert sum(binomial_tail(first, total, share) for share in shares) <= FALSE_BLOCK_RATE * (1 + 1e-9)


def test_the_messages_state_the_share_sample_and_bound():
    assert weigh(2, 64, 0.02).bound_text() == "limit 2%; of 64 rows, 8 would block (false-block rate 1 in 10,000)"
    blocked = weigh(56, 64, 0.02)
    assert blocked.bound_text().startswith("limit 2%; true share at least 66.3% (") and blocked.share == 56 / 64
    assert blocked.metadata("empty_") == {
        "empty_blocks": True,
        "empty_blocks_from": 8,
        "empty_true_share_lower_bound": blocked.lower_bound,
        "empty_false_block_rate": FALSE_BLOCK_RATE,
    }
    assert evidence.percent(0.005) == "0.5%" and evidence.percent(0.1) == "10%"
