"""What a pilot found, in the store, and what it decides for the shards.

Each pilot writes its `PilotRecord` to `pilot/<fingerprint>.json` (the last pilot run with those generation
settings), to `pilot/latest.json` (the last pilot of any settings: what `dflash plan --project` reads) and to
`pilot/runs/<start>-<fingerprint>.json`, never overwritten: every pilot's output is in the waste ledger. The
shards' generation asks `clearance` before it starts: a passed pilot with the same generation-settings fingerprint,
or the operator's recorded decision to skip it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from dagster_project.generation_settings import GenerationSettings
from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.layout import PILOT
from dagster_project.store.storage import Store

LATEST_KEY = f"{PILOT}/latest.json"
# What the operator runs; the README's and the demo's form.
PILOT_COMMAND = "dagster asset materialize -m dagster_project.definitions --select pilot"
SKIP_SWITCH = "DFLASH_SKIP_PILOT=1 (or skip_pilot: true in completions' run config)"
PERCENTILES = (10, 50, 90, 99)


RUNS_PREFIX = f"{PILOT}/runs/"


def pilot_key(fingerprint: str) -> str:
    return f"{PILOT}/{fingerprint}.json"


def pilot_run_key(record: PilotRecord) -> str:
    return f"{RUNS_PREFIX}{int(record.started_at * 1000):015d}-{record.settings_fingerprint}.json"


@dataclass(frozen=True)
class LengthDistribution:
    """Output tokens per answer: percentiles and a histogram on powers of two (`"<=256": n` counts 129..256)."""

    answers: int = 0
    mean: float = 0.0
    percentiles: dict[str, float] = field(default_factory=dict)  # "p10", "p50", ..., "max"
    histogram: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, lengths: np.ndarray) -> LengthDistribution:
        lengths = np.asarray(lengths, dtype=np.int64)
        if not lengths.size:
            return cls()
        quantiles = np.percentile(lengths, PERCENTILES)
        percentiles = {f"p{p}": float(q) for p, q in zip(PERCENTILES, quantiles, strict=True)}
        percentiles["max"] = float(lengths.max())
        bins = np.maximum(np.ceil(np.log2(np.maximum(lengths, 1))), 0).astype(np.int64)
        values, counts = np.unique(bins, return_counts=True)
        histogram = {f"<={2 ** int(b)}": int(n) for b, n in zip(values, counts, strict=True)}
        return cls(int(lengths.size), float(lengths.mean()), percentiles, histogram)

    def describe(self) -> str:
        if not self.answers:
            return "no answers"
        p = self.percentiles
        return (
            f"mean {self.mean:,.0f}, p10 {p['p10']:,.0f}, p50 {p['p50']:,.0f}, p90 {p['p90']:,.0f}, "
            f"p99 {p['p99']:,.0f}, max {p['max']:,.0f} output tokens"
        )


@dataclass(frozen=True)
class PilotRecord:
    passed: bool
    settings_fingerprint: str
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    started_at: float = 0.0
    finished_at: float = 0.0
    run_id: str | None = None
    # The sample: conversations chosen of those published, and how the job's strata are covered.
    population: int = 0
    conversations: int = 0
    strata: dict[str, int] = field(default_factory=dict)
    uncovered_strata: list[str] = field(default_factory=list)
    # What the fleet answered.
    answers: int = 0  # generation events, answered or not
    ok: int = 0
    errors: int = 0
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    req_per_s: float = 0.0
    output_tok_per_s: float = 0.0
    avg_prompt_tokens: float = 0.0
    accept_length: float | None = None  # None: no server reported spec-decoding stats (MTP off)
    output_lengths: LengthDistribution = field(default_factory=LengthDistribution)
    # What the fleet generated for the pilot, none of it a training row: its answers' output tokens, and what its
    # servers generated that no answer holds, by cause (`Unrecorded.as_dict`).
    output_tokens: int = 0
    unrecorded: dict = field(default_factory=dict)
    # The fingerprint of the tokenizer the pilot ran under (`TokenizerIdentity.fingerprint`; empty in a record from
    # before: unknown, never taken for a mismatch). Another model's pilot clears nothing of this one.
    tokenizer: str = ""
    servers: list[str] = field(default_factory=list)
    # Every gate's message, and those of the gates that blocked (name → message).
    gates: dict[str, str] = field(default_factory=dict)
    failed_gates: dict[str, str] = field(default_factory=dict)

    @property
    def error_share(self) -> float:
        return self.errors / self.answers if self.answers else 0.0

    def label(self) -> str:
        """`pilot of N answers at TIME`: how the plan and `dflash plan --project` name it."""
        at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.finished_at))
        return f"pilot of {self.answers:,} answers at {at}"

    def job_inputs(self) -> dict[str, float]:
        """What `dflash plan --project` takes from the pilot (the fields of `ops.projection.Job`)."""
        return {"output_tokens": round(self.output_lengths.mean, 1), "prompt_tokens": round(self.avg_prompt_tokens, 1)}

    def summary(self) -> str:
        verdict = "passed" if self.passed else f"BLOCKED by {', '.join(sorted(self.failed_gates))}"
        accept = f"{self.accept_length:.2f}" if self.accept_length else "— (MTP off)"
        return (
            f"{self.label()} ({self.conversations} of {self.population:,} conversations, settings "
            f"{self.settings_fingerprint}): {verdict}; {self.req_per_s:.2f} req/s, {self.output_tok_per_s:,.0f} out "
            f"tok/s, accept length {accept}, errors {self.error_share:.1%}; {self.output_lengths.describe()}"
        )


def write_pilot(store: Store, record: PilotRecord) -> None:
    data = to_json(record)
    store.put_bytes(pilot_run_key(record), data)
    store.put_bytes(pilot_key(record.settings_fingerprint), data)
    store.put_bytes(LATEST_KEY, data)


def read_pilot(store: Store, fingerprint: str) -> PilotRecord | None:
    return read_record(store, pilot_key(fingerprint), PilotRecord)


def read_latest_pilot(store: Store) -> PilotRecord | None:
    return read_record(store, LATEST_KEY, PilotRecord)


def read_pilot_runs(store: Store) -> list[PilotRecord]:
    """Every pilot run's record, oldest first."""
    keys = sorted(info.key for info in store.list(RUNS_PREFIX) if info.key.endswith(".json"))
    return [record for key in keys if (record := read_record(store, key, PilotRecord)) is not None]


@dataclass(frozen=True)
class Clearance:
    """Whether the shards may generate under these settings, and the line that says why (or why not)."""

    allowed: bool
    message: str
    skipped: bool = False


def clearance(store: Store, fingerprint: str, *, tokenizer: str = "", skip: bool = False) -> Clearance:
    """Generation under `fingerprint` and the `tokenizer` fingerprint is allowed once a pilot with both passed, or
    when the operator skips the pilot (`skip`); otherwise one line naming the command to run."""
    if skip:
        return Clearance(True, f"pilot skipped ({SKIP_SWITCH})", skipped=True)
    record = read_pilot(store, fingerprint)
    other_model = record is not None and bool(record.tokenizer and tokenizer) and record.tokenizer != tokenizer
    if record is not None and record.passed and not other_model:
        return Clearance(True, f"{record.label()} passed with settings {fingerprint}")
    if record is None:
        why = f"no pilot has run with these generation settings (fingerprint {fingerprint})"
    elif other_model:
        why = f"the {record.label()} with these settings ran under tokenizer {record.tokenizer}, not {tokenizer}"
    else:
        why = f"the {record.label()} with these settings was blocked by {', '.join(sorted(record.failed_gates))}"
    return Clearance(False, f"{why}: run `{PILOT_COMMAND}` first, or set {SKIP_SWITCH} to generate without one")
