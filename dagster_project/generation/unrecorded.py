"""Answers the fleet generated that no record holds, by cause: what the dispatcher counts, the completions
manifest's run summary keeps and the waste ledger prices. A light module: `dflash status` reads these names."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# Output the fleet generated that no recorded answer holds, by cause (the waste ledger's causes of the same names).
REFUSED = "refused"  # answers that broke the answer contract (`sglang.answer_contract`): never rows
ERRORS_AND_RETRIES = "errors_and_retries"  # what failed attempts (aborted by their server, cut short) wrote
LOST_HEDGES = "lost_hedges"  # answers that arrived after another attempt of their request had won
RESENT_ORIGINAL = "resent_original"  # what attempts aborted because their request was sent again wrote
PROBES = "probes"  # the one-token canaries a set-aside server answers to rejoin
# What requests in flight when their run stopped (a hold whose drain ran out, a failure, a lost lease) wrote before
# they were aborted: their answers reach no record, and the shard's next run asks them again.
STOPPED_IN_FLIGHT = "stopped_in_flight"


@dataclass
class Unrecorded:
    """Answers the fleet generated that are in no record, and their output tokens, by cause."""

    answers: Counter = field(default_factory=Counter)
    tokens: Counter = field(default_factory=Counter)

    def add(self, cause: str, tokens: int) -> None:
        self.answers[cause] += 1
        self.tokens[cause] += tokens

    def as_dict(self) -> dict:
        return {"answers": dict(self.answers), "tokens": dict(self.tokens)}

    @classmethod
    def of(cls, counted: dict) -> Unrecorded:
        """From `as_dict`'s form."""
        return cls(Counter(counted.get("answers") or {}), Counter(counted.get("tokens") or {}))

    def __add__(self, other: Unrecorded) -> Unrecorded:
        return Unrecorded(self.answers + other.answers, self.tokens + other.tokens)
