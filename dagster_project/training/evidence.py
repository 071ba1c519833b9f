"""When a share seen in a sample is evidence enough to block: the one rule every answer-level gate decides by.

A gate counts `count` rows of `total` with some defect and has a limit, the largest true share of that defect a
healthy shard may have. Blocking whenever `count / total` exceeds the limit blocks healthy shards by chance, the
more often the smaller the sample: one broken answer in a 64-row shard is 1.6%, over a 1% limit. Instead a gate
blocks only on evidence that the true share is above the limit: when a shard whose true share *were* the limit
would show `count` or more with probability at most `false_block_rate` (the exact one-sided binomial tail;
equivalently, the one-sided Clopper-Pearson lower bound of the true share lies above the limit). So a shard at or
under its limit is blocked at most once in 1 / `false_block_rate` shards, at 20 rows, 500 or a fleet's 500,000
answers alike, and the limits keep their meaning. The sample size is part of the rule: a sample too small for
even all of it to be evidence cannot block (`blocks_from` is None), and the count that blocks grows with the sample
(at a 1% limit: 4 of 20, 6 of 64, 16 of 500).

The most common of many values (a loss_mask sum, an answer text) is one test per value, since any of them could
be the top one. If no value's true share exceeds the limit, the chance that the top count reaches k is at most
the sum over values of P(Bin(n, share) >= k); that tail is convex in the share below its mode and 0 at 0, so the
sum is largest with every share at the limit (1 / limit values of them): P(top >= k) <= P(Bin(n, limit) >= k) /
limit, whatever the healthy spread, long-tailed or not. `among_many` tests at `false_block_rate` x limit.

Pure Python (math only): the watch calls it on every look, `dflash status` on every call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# At most one false block in 10,000 (shard, gate) verdicts at the limit itself: over the real job's ~1,830 shards
# and 7 such gates, ~1 at worst, and healthy shards sit well under their limits.
FALSE_BLOCK_RATE = 1e-4

# Terms of the binomial sum smaller than this share of the sum so far no longer change a float.
_NEGLIGIBLE = 1e-17
# A tail equal to the rate blocks; limits and rates are round numbers (0.01 ** 2 == 1e-4), so the last bits of
# lgamma and exp, which differ between C libraries, must not decide a tie.
_TIE = 1 + 1e-9


def binomial_tail(count: int, total: int, share: float) -> float:
    """P(X >= count) for X ~ Binomial(total, share), summed exactly from the count outwards (float precision)."""
    if count <= 0:
        return 1.0
    if count > total or share <= 0.0:
        return 0.0
    if share >= 1.0:
        return 1.0
    odds = share / (1.0 - share)
    mode = math.floor((total + 1) * share)
    if count > mode:  # the terms fall from `count` up: sum the upper tail itself
        return min(1.0, _sum_away(count, total, share, odds, upward=True))
    # `count` lies at or below the mode: the lower tail is the short sum, and the tail is not small.
    return max(0.0, 1.0 - _sum_away(count - 1, total, share, odds, upward=False))


def _log_pmf(k: int, total: int, share: float) -> float:
    return (
        math.lgamma(total + 1)
        - math.lgamma(k + 1)
        - math.lgamma(total - k + 1)
        + k * math.log(share)
        + (total - k) * math.log1p(-share)
    )


def _sum_away(start: int, total: int, share: float, odds: float, *, upward: bool) -> float:
    """P(X = start) + the terms beyond it away from the mode, each from the last by the pmf's ratio."""
    term = math.exp(_log_pmf(start, total, share))
    result, k = term, start
    while term > result * _NEGLIGIBLE:
        if upward:
            if k == total:
                break
            term *= (total - k) / (k + 1) * odds
            k += 1
        else:
            if k == 0:
                break
            term *= k / (total - k + 1) / odds
            k -= 1
        result += term
    return result


@lru_cache(maxsize=8192)
def _first_blocking_count(total: int, limit: float, test_rate: float) -> int | None:
    """The smallest count whose tail at `limit` is at most `test_rate` (None: not even all `total` rows)."""
    if total < 1 or binomial_tail(total, total, limit) > test_rate * _TIE:
        return None
    low, high = 1, total  # the tail falls with the count: the answer lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if binomial_tail(middle, total, limit) <= test_rate * _TIE:
            high = middle
        else:
            low = middle + 1
    return low


@lru_cache(maxsize=8192)
def lower_bound(count: int, total: int, test_rate: float) -> float:
    """The one-sided lower confidence bound of the true share at level 1 - `test_rate` (Clopper-Pearson): the share
    at which `count` or more of `total` has probability exactly `test_rate`."""
    if count <= 0 or total <= 0:
        return 0.0
    low, high = 0.0, count / total  # the tail rises with the share: at count / total it is about a half
    for _ in range(50):  # to 1e-15 of count / total
        middle = (low + high) / 2
        if binomial_tail(count, total, middle) > test_rate:
            high = middle
        else:
            low = middle
    return low


def percent(share: float) -> str:
    """A limit or bound as people write it: 5%, 0.5%, 12.5%."""
    return f"{100 * share:.3g}%"


def one_in(rate: float) -> str:
    return f"1 in {round(1 / rate):,}" if rate > 0 else "never"


@dataclass(frozen=True)
class Evidence:
    """What `count` of `total` says about a limit, and whether it is enough to block."""

    count: int
    total: int
    limit: float
    false_block_rate: float
    test_rate: float  # the tail probability a count must reach to block (false_block_rate x limit among many)
    blocks_from: int | None  # the smallest count that blocks at this sample size; None: none does
    lower_bound: float  # the true share is at least this, wrong at most `test_rate` of the time

    @property
    def share(self) -> float:
        return self.count / self.total if self.total else 0.0

    @property
    def blocks(self) -> bool:
        return self.blocks_from is not None and self.count >= self.blocks_from

    def bound_text(self, unit: str = "rows") -> str:
        """The limit and the bound that decided, for a gate's message: `limit 2%; ...` (`unit`: what is counted)."""
        rate = f"false-block rate {one_in(self.false_block_rate)}"
        if self.blocks:
            return f"limit {percent(self.limit)}; true share at least {percent(self.lower_bound)} ({rate})"
        if self.blocks_from is None:
            return f"limit {percent(self.limit)}; {self.total} {unit} are too few to block ({rate})"
        return f"limit {percent(self.limit)}; of {self.total} {unit}, {self.blocks_from} would block ({rate})"

    def metadata(self, prefix: str = "") -> dict[str, Any]:
        return {
            f"{prefix}blocks": self.blocks,
            f"{prefix}blocks_from": self.blocks_from,
            f"{prefix}true_share_lower_bound": self.lower_bound,
            f"{prefix}false_block_rate": self.false_block_rate,
        }


def weigh(
    count: int,
    total: int,
    limit: float,
    *,
    false_block_rate: float = FALSE_BLOCK_RATE,
    among_many: bool = False,
    min_count: int = 1,
) -> Evidence:
    """The evidence that the true share behind `count` of `total` exceeds `limit`.

    `among_many`: `count` is the largest of many values' counts (the Bonferroni-like bound in the module's
    docstring). `min_count`: a count below it never blocks, whatever the evidence (a configured floor).
    """
    if not 0.0 < false_block_rate < 1.0:
        raise ValueError(f"false_block_rate must lie in (0, 1), got {false_block_rate}")
    test_rate = false_block_rate * min(max(limit, 0.0), 1.0) if among_many else false_block_rate
    first = _first_blocking_count(total, limit, test_rate)
    blocks_from = None if first is None or max(first, min_count) > total else max(first, min_count)
    return Evidence(count, total, limit, false_block_rate, test_rate, blocks_from, lower_bound(count, total, test_rate))
