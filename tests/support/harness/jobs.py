"""Small random jobs from a seed: input layouts, a multi-turn policy, `fit` on or off, one fault, a hold or not.

A job is plain data (`Job`), drawn by `build_job(seed)` with `random.Random(seed)`: the same seed gives the same job
on every machine, so a seed that breaks a promise names a reproducible case. `describe` says what a seed drew.

Every input row carries its own id, and its text names that id, so the checks can account for each row by id and
tell which file it was credited to (`InputFile.rows`, `expected_rows`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dagster_project.records import POLICIES


class Fault(StrEnum):
    NONE = "none"
    KILL = "kill"  # one server SIGKILLed mid-shard
    HANG_AND_RECOVER = "hang_and_recover"  # one server hangs with requests in flight, then comes back
    BROKEN_ANSWERS = "broken_answers"  # one server's answers break the request's contract (an altering proxy)
    GENERATE_HANGS = "generate_hangs"  # one server's /health answers, its /generate never does
    S3_OUTAGE = "s3_outage"  # the store's S3 endpoint resets connections for a while mid-shard


# Faults that need requests in flight at a server, and the rows a job with one of them has at least.
IN_FLIGHT_FAULTS = frozenset({Fault.KILL, Fault.HANG_AND_RECOVER})
MIN_ROWS_IN_FLIGHT = 12

# Faults of the fleet or the store that leave the data healthy: answers are what the model wrote.
HEALTHY_DATA_FAULTS = frozenset({Fault.NONE, Fault.S3_OUTAGE})


class Layout(StrEnum):
    LOCAL_JSONL = "local_jsonl"
    GZIP = "gzip"  # a .jsonl.gz file
    BROKEN_GZIP = "broken_gzip"  # a .jsonl.gz cut short: the rows before the break count, the file is named
    BAD_ROWS = "bad_rows"  # rows that are not JSON, or hold no conversation
    S3_SAME_NAMES = "s3_same_names"  # a/train.jsonl, b/train.jsonl, c/train.jsonl on S3, read side by side


# A local file this large makes ingest read its files in worker processes (`ingest.stage.PARALLEL_MIN_BYTES`), the
# S3 files among them side by side: random bytes under a .jsonl.gz name, unreadable from its first byte (cheap).
NOISE_BYTES = 17 << 20

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
WORDS = "apple river stone cloud seven orange quick lamp north paper silver garden".split()


@dataclass(frozen=True)
class InputRow:
    id: str | None  # None: a line that is not a row (its file and position account for it)
    line: str  # the line as written (JSON, or not)
    expect_kept: bool  # a well-formed conversation (it may still be dropped later, with a reason)


@dataclass(frozen=True)
class InputFile:
    name: str  # relative path: the local file under the job's input dir, or the key under the bucket's inputs/
    on_s3: bool
    layout: Layout
    rows: list[InputRow]
    noise_bytes: int = 0  # not rows at all: this many random bytes, to be named unreadable


@dataclass(frozen=True)
class Job:
    seed: int
    files: list[InputFile]
    policy: str
    fit: bool  # max_new_tokens: fit (`GenerationSettings.fit_max_length`)
    num_shards: int
    servers: int
    fault: Fault
    hold: bool  # a hold of the line before generation, then its release
    store_on_s3: bool
    notes: list[str] = field(default_factory=list)

    @property
    def healthy_data(self) -> bool:
        return self.fault in HEALTHY_DATA_FAULTS

    def describe(self) -> str:
        layouts = ",".join(sorted({f.layout.value for f in self.files}))
        rows = sum(len(f.rows) for f in self.files)
        return (
            f"seed {self.seed}: {rows} rows in {len(self.files)} files ({layouts}), policy {self.policy}, "
            f"fit {'on' if self.fit else 'off'}, {self.num_shards} shard(s), {self.servers} servers, "
            f"fault {self.fault.value}, hold {'and release' if self.hold else 'none'}, "
            f"store {'s3' if self.store_on_s3 else 'local'}"
        )


def _text(rng: random.Random, row_id: str, what: str) -> str:
    return f"[{row_id}] {what}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + "?"


def _row(rng: random.Random, row_id: str) -> dict[str, Any]:
    kind = rng.choice(["single", "single", "multi", "tools"])
    if kind == "single":
        return {"id": row_id, "messages": [{"role": "user", "content": _text(rng, row_id, "question")}]}
    if kind == "multi":
        messages = []
        for turn in range(rng.randint(2, 3)):
            messages.append({"role": "user", "content": _text(rng, row_id, f"turn {turn}")})
            messages.append({"role": "assistant", "content": f"The source's answer {turn}."})
        return {"id": row_id, "messages": messages}
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": rng.choice(WORDS)}}}
    return {
        "id": row_id,
        "messages": [
            {"role": "user", "content": _text(rng, row_id, "weather")},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": json.dumps({"temp": rng.randint(-5, 35)})},
        ],
        "tools": TOOLS,
    }


def _rows(rng: random.Random, prefix: str, count: int) -> list[InputRow]:
    return [InputRow(f"{prefix}-r{i}", json.dumps(_row(rng, f"{prefix}-r{i}")), True) for i in range(count)]


def _bad_rows(rng: random.Random, prefix: str, count: int) -> list[InputRow]:
    rows = _rows(rng, prefix, count)
    bad = [
        InputRow(None, "{not json", False),
        InputRow(f"{prefix}-nomsg", json.dumps({"id": f"{prefix}-nomsg", "messages": []}), False),
        InputRow(f"{prefix}-empty", json.dumps({"id": f"{prefix}-empty", "messages": [{"role": "user"}]}), False),
    ]
    for row in bad:
        rows.insert(rng.randint(0, len(rows)), row)
    return rows


def _files(rng: random.Random, seed: int, layout: Layout, index: int) -> list[InputFile]:
    prefix = f"s{seed}f{index}"
    count = rng.randint(3, 8)
    match layout:
        case Layout.LOCAL_JSONL:
            return [InputFile(f"{prefix}/prompts.jsonl", False, layout, _rows(rng, prefix, count))]
        case Layout.GZIP:
            return [InputFile(f"{prefix}/prompts.jsonl.gz", rng.random() < 0.5, layout, _rows(rng, prefix, count))]
        case Layout.BROKEN_GZIP:
            return [InputFile(f"{prefix}/broken.jsonl.gz", False, layout, _rows(rng, prefix, count + 4))]
        case Layout.BAD_ROWS:
            return [InputFile(f"{prefix}/mixed.jsonl", False, layout, _bad_rows(rng, prefix, count))]
        case Layout.S3_SAME_NAMES:
            same = [
                InputFile(f"{prefix}/{part}/train.jsonl", True, layout, _rows(rng, f"{prefix}{part}", count))
                for part in "abc"
            ]
            noise = InputFile(f"{prefix}/noise.jsonl.gz", False, layout, [], noise_bytes=NOISE_BYTES)
            return [*same, noise]
    raise ValueError(layout)


def build_job(seed: int) -> Job:
    rng = random.Random(seed)
    layouts = rng.sample(list(Layout), rng.randint(1, 3))
    files = [f for index, layout in enumerate(layouts) for f in _files(rng, seed, layout, index)]
    fault = rng.choice(list(Fault))
    extra = random.Random(-seed)  # drawn apart: the other seeds' jobs stay the same
    while fault in IN_FLIGHT_FAULTS and sum(len(f.rows) for f in files) < MIN_ROWS_IN_FLIGHT:
        # Enough requests for the fault to find some in flight.
        files += _files(extra, seed, Layout.LOCAL_JSONL, len(files))
    return Job(
        seed=seed,
        files=files,
        policy=rng.choice(POLICIES),
        fit=rng.random() < 0.4,
        num_shards=rng.choice([1, 2]),
        servers=3 if fault in (Fault.KILL, Fault.HANG_AND_RECOVER) else 2,
        fault=fault,
        hold=rng.random() < 0.3,
        store_on_s3=fault is Fault.S3_OUTAGE or rng.random() < 0.3,
    )
