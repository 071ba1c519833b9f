"""Benchmark: how often each answer-level gate blocks a healthy shard, and how surely it stops the seed's disaster.

    python -m benchmarks.bench_gates [--shards 5000] [--runs 1000] [--seed 0]

Simulated shards, judged by the real gates (`training.gates.shard_gates` and the completions' error and
length-capped shares) on the figures they read, synthesized per row rather than tokenized (a shard of 500
answers of ~2,500 tokens each would take minutes through the tokenizer; the gates read lengths, think-marker
counts, blank reasoning and answer texts, nothing else):

* **answer lengths** from the simulator's own sampler (`sim.outputs.parse_length_distribution`): lognormal
  with the brief's measured mean of 2,472 output tokens and sigma 0.8, capped at `max_new_tokens` 32,768; for
  the rehearsal's row, the simulator's `uniform:48:160` it ran with (113 lengths);
* **natural defects** of a healthy run, each inside its gate's limit (`HEALTHY`: assumed rates, stated in the
  report), and a stress with every one at half its limit (`HALF_LIMITS`);
* **the seed's disaster** (`\\n</think>\\n\\nOK.<|im_end|>`, loss_mask sum 6), its figures profiled once through
  the real tokenizer and `profile_outputs`, mixed in per row at a share.

Each gate is measured under two rules in the same run: **fixed**, the rule before `training.evidence` (a share
over its limit blocks; a top loss_mask sum or answer once it recurs `min_repeats` times), read from the same
results' metadata; and **evidence**, the gates' own verdict. Measured: false blocks per 1,000 healthy shards of
64 and of 500 rows (with the exact worst case at the limit itself); shards of 20, 32, 64 and 500 rows with the
disaster at 87% blocked; and the **watch**, the gates applied to the first k = 50, 100, 200 answers of a run, in
dispatch order and in completion order (a fleet of 7 servers x 48 requests starts 336 at once: the first k to
finish are the k shortest of those): how many runs the disaster stops, how many healthy runs it stops, and the
smallest disaster share it stops in 99% of runs within 200 answers. Writes the `gates` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from benchmarks.report import write_section
from dagster_project.generation.line_stop import WatchOptions
from dagster_project.sglang.sim.outputs import parse_length_distribution
from dagster_project.tokenizer import load_tokenizer, special_ids
from dagster_project.training import evidence, gate_result, gates
from dagster_project.training.evidence import percent
from dagster_project.training.gate_sets import MAX_ERROR_SHARE, MAX_LENGTH_CAPPED_SHARE, share_gate
from dagster_project.training.output_profile import OutputProfile, profile_outputs
from dagster_project.training.watch_figures import WINDOW

MEAN_OUTPUT_TOKENS = 2472  # the brief's measured average
SIGMA = 0.8
LENGTHS = f"lognormal:{MEAN_OUTPUT_TOKENS / math.exp(SIGMA**2 / 2):.0f}:{SIGMA}"  # mean = median x e^(sigma^2 / 2)
REHEARSAL_LENGTHS = "uniform:48:160"
MAX_NEW_TOKENS = 32768
DISASTER_TEXT = "\n</think>\n\nOK.<|im_end|>"
SEED_SHARE = 0.87
SIZES = (64, 500)
DISASTER_SIZES = (20, 32, 64, 500)
LOOKS = (50, 100, 200)
IN_FLIGHT = 7 * 48  # the brief's fleet: 7 servers, 48 client requests each
MIXED_SHARES = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.10, 0.12, 0.15, 0.20)
ORDERS = ("dispatch", "completion")
STOPPED = 0.99  # "stops a share": in at least this many of the runs
SHORT_POOL = ("4", "Yes.", "No.", "42", "True", "Paris.", "12", "x = 3", "B", "None.", "2", "False", "7", "Done.")
LIMITS = gates.GateThresholds()
GATES = (
    "error_rate",
    "length_capped_rate",
    "loss_sum_floor",
    "loss_sum_concentration",
    "thinking_structure",
    "degenerate_answers",
    "short_answers",
)


@dataclass(frozen=True)
class Defects:
    """Per-row shares of what a gate counts, in a healthy run."""

    error: float  # the event ended in an error
    runaway: float  # reasoning that never ends: length-capped, not finished
    trivial: float  # a one-line exchange: fewer than 32 supervised tokens
    short: float  # a visible answer under 8 characters ("4", "Yes."), after real reasoning
    empty: float  # no visible answer after real reasoning
    broken_thinking: float  # no `</think>` in a finished answer
    repeated_length: float = 0.0  # one output length (1,000 tokens) on this share of rows
    repeated_answer: float = 0.0  # one answer text on this share of prompts


# Assumed rates for a healthy thinking model, each 3-10x inside its gate's limit.
HEALTHY = Defects(error=0.003, runaway=0.01, trivial=0.003, short=0.02, empty=0.001, broken_thinking=0.002)
# Every defect at half its limit (short: 5% in all with the empty ones): healthy by each gate's definition.
HALF_LIMITS = Defects(
    error=MAX_ERROR_SHARE / 2,
    runaway=MAX_LENGTH_CAPPED_SHARE / 2,
    trivial=LIMITS.max_share_below_floor / 2,
    short=LIMITS.max_short_answer_share / 2 - LIMITS.max_empty_answer_share / 2,
    empty=LIMITS.max_empty_answer_share / 2,
    broken_thinking=LIMITS.max_bad_thinking_share / 2,
    repeated_length=LIMITS.max_top_loss_sum_share / 2,
    repeated_answer=LIMITS.max_degenerate_share / 2,
)
KINDS = ("healthy", "error", "runaway", "trivial", "short", "empty", "broken", "length", "answer", "disaster")


@dataclass(frozen=True)
class DisasterFigures:
    """What `profile_outputs` reads from the seed's answer through the real tokenizer."""

    tokens: int
    think_ends: int
    blank: bool
    answer: str


def disaster_figures() -> DisasterFigures:
    tok = load_tokenizer()
    ids = tok.encode(DISASTER_TEXT, add_special_tokens=False)
    profile = profile_outputs(pa.array([ids], pa.list_(pa.int32())), special_ids(tok), tok.decode)
    return DisasterFigures(
        int(profile.lengths[0]), int(profile.think_ends[0]), bool(profile.blank_reasoning[0]), profile.answer_texts[0]
    )


@dataclass
class Answers:
    """A run's answers in dispatch order: the figures the gates read, per row."""

    kinds: np.ndarray  # index into KINDS
    tokens: np.ndarray  # output tokens (supervised tokens of the training row)
    texts: list[str]  # visible answer
    uid: int  # first row's id, so prompts and answers differ across shards

    def take(self, rows: np.ndarray) -> Answers:
        return Answers(self.kinds[rows], self.tokens[rows], [self.texts[i] for i in rows], self.uid)


class Simulator:
    def __init__(self, seed: int, disaster: DisasterFigures, lengths: str = LENGTHS):
        self.random = random.Random(seed)
        self.rng = np.random.default_rng(seed)
        self.length = parse_length_distribution(lengths)
        self.disaster = disaster
        self.uid = 0

    def answers(self, rows: int, defects: Defects, disaster_share: float = 0.0) -> Answers:
        shares = np.array(
            [
                defects.error,
                defects.runaway,
                defects.trivial,
                defects.short,
                defects.empty,
                defects.broken_thinking,
                defects.repeated_length,
                defects.repeated_answer,
            ]
        )
        healthy = 1.0 - shares.sum()
        probs = np.concatenate([[healthy], shares, [0.0]]) * (1 - disaster_share)
        probs[-1] = disaster_share
        kinds = self.rng.choice(len(KINDS), size=rows, p=probs / probs.sum())
        tokens = np.array([min(max(1, self.length(self.random)), MAX_NEW_TOKENS) for _ in range(rows)])
        tokens[kinds == KINDS.index("runaway")] = MAX_NEW_TOKENS
        trivial = kinds == KINDS.index("trivial")
        tokens[trivial] = self.rng.integers(8, LIMITS.loss_floor, int(trivial.sum()))
        tokens[kinds == KINDS.index("length")] = 1000
        tokens[kinds == KINDS.index("disaster")] = self.disaster.tokens
        first = self.uid
        self.uid += rows
        texts = []
        for i, kind in enumerate(kinds):
            name = KINDS[kind]
            if name == "short":
                texts.append(self.random.choices(SHORT_POOL, weights=[1 / (r + 1) for r in range(len(SHORT_POOL))])[0])
            elif name == "empty":
                texts.append("")
            elif name == "answer":
                texts.append("The answer is 42, as computed above.")
            elif name == "disaster":
                texts.append(self.disaster.answer)
            else:  # its own answer: the gates read only whether it is short and whether it recurs
                texts.append(f"answer {first + i}")
        return Answers(kinds, tokens, texts, first)


def judge(answers: Answers, disaster: DisasterFigures) -> list[gate_result.GateResult]:
    """The gates over these answers, as the completions and training-set checks run them."""
    kinds, events = answers.kinds, int(answers.kinds.size)
    ok = kinds != KINDS.index("error")
    finished = ok & (kinds != KINDS.index("runaway"))
    rows = np.flatnonzero(finished)  # the training rows: errors have none, length-capped ones are excluded
    sums = answers.tokens[rows].astype(np.int64)
    row_kinds = kinds[rows]
    disastrous = row_kinds == KINDS.index("disaster")
    think_ends = np.where(row_kinds == KINDS.index("broken"), 0, 1)
    think_ends[disastrous] = disaster.think_ends
    ids = [str(answers.uid + i).encode() for i in rows]
    profile = gates.ShardProfile(
        loss_sums=sums,
        pairs=np.maximum(sums - 1, 0),
        min_ids=np.zeros(rows.size, np.int64),
        max_ids=np.zeros(rows.size, np.int64),
        finished=np.ones(rows.size, bool),
        outputs=OutputProfile(
            lengths=sums,
            think_ends=think_ends,
            think_starts=np.zeros(rows.size, np.int64),
            blank_reasoning=disastrous & disaster.blank,
            answer_texts=[answers.texts[i] for i in rows],
        ),
        prompt_digests=ids,
        event_ids=[i.decode() for i in ids],
    )
    results = gates.shard_gates(profile, vocab_size=1, enable_thinking=True)
    capped = int((kinds == KINDS.index("runaway")).sum())
    return [
        share_gate("error_rate", int((~ok).sum()), events, MAX_ERROR_SHARE, "ended in an error", {}),
        share_gate("length_capped_rate", capped, events, MAX_LENGTH_CAPPED_SHARE, "hit max_new_tokens", {}),
        *(result for result in results if result.name in GATES),
    ]


def fixed_rule_blocks(result: gate_result.GateResult) -> bool:
    """The verdict of the rule before `training.evidence`, from the same result's figures."""
    m = result.metadata
    if result.name in ("error_rate", "length_capped_rate"):
        return m["share"] > m["max_share"]
    if result.name == "loss_sum_floor":
        return m["rows"] == 0 or m["share_below_floor"] > m["max_share_below_floor"]
    if result.name == "loss_sum_concentration":
        return m.get("top_count", 0) >= m["min_repeats"] and m.get("top_share", 0.0) > m["max_top_share"]
    if result.name == "thinking_structure":
        return m["finished_rows_checked"] > 0 and m["bad_share"] > m["max_bad_share"]
    if result.name == "degenerate_answers":
        return m.get("top_answer_prompts", 0) >= m["min_repeats"] and m.get("top_answer_share", 0.0) > m["max_share"]
    if result.name == "short_answers":
        return m["empty_share"] > m["max_empty_share"] or m["short_share"] > m["max_short_share"]
    raise ValueError(result.name)


RULES: dict[str, Callable[[gate_result.GateResult], bool]] = {
    "fixed": fixed_rule_blocks,
    "evidence": lambda result: not result.passed,
}


def false_blocks(sim: Simulator, disaster: DisasterFigures, rows: int, defects: Defects, shards: int) -> dict:
    """Per gate and rule, how many of `shards` healthy shards were blocked."""
    counts = {(gate, rule): 0 for gate in GATES for rule in RULES}
    for _ in range(shards):
        for result in judge(sim.answers(rows, defects), disaster):
            for rule, blocks in RULES.items():
                counts[result.name, rule] += blocks(result)
    return counts


def worst_case(rows: int) -> dict[str, float]:
    """The evidence rule's false-block probability with the true share exactly at each limit (exact, for a
    sample of `rows`; among many values, the bound of `training.evidence`)."""
    share_limits = {
        "error_rate": MAX_ERROR_SHARE,
        "length_capped_rate": MAX_LENGTH_CAPPED_SHARE,
        "loss_sum_floor": LIMITS.max_share_below_floor,
        "thinking_structure": LIMITS.max_bad_thinking_share,
    }
    worst = {}
    for gate, limit in share_limits.items():
        first = evidence.weigh(0, rows, limit).blocks_from
        worst[gate] = evidence.binomial_tail(first, rows, limit)
    # short_answers blocks on either of its two shares: at most the sum.
    worst["short_answers"] = sum(
        evidence.binomial_tail(evidence.weigh(0, rows, limit).blocks_from, rows, limit)
        for limit in (LIMITS.max_short_answer_share, LIMITS.max_empty_answer_share)
    )
    for gate, limit in (
        ("loss_sum_concentration", LIMITS.max_top_loss_sum_share),
        ("degenerate_answers", LIMITS.max_degenerate_share),
    ):
        first = evidence.weigh(0, rows, limit, among_many=True, min_count=LIMITS.min_repeats).blocks_from
        worst[gate] = evidence.binomial_tail(first, rows, limit) / limit
    return worst


def shards_blocked(sim: Simulator, disaster: DisasterFigures, rows: int, share: float, shards: int) -> dict:
    """Per rule: how many shards any gate blocked, and how many the weakest answer gate blocked."""
    blocked = {rule: 0 for rule in RULES}
    every_answer_gate = {rule: 0 for rule in RULES}
    answer_gates = {"loss_sum_floor", "loss_sum_concentration", "thinking_structure", "degenerate_answers"}
    answer_gates.add("short_answers")
    for _ in range(shards):
        results = judge(sim.answers(rows, HEALTHY, share), disaster)
        for rule, blocks in RULES.items():
            verdicts = {r.name: blocks(r) for r in results}
            blocked[rule] += any(verdicts.values())
            every_answer_gate[rule] += all(verdicts[name] for name in answer_gates)
    return {"any": blocked, "all_five": every_answer_gate}


def watch(sim: Simulator, disaster: DisasterFigures, share: float, runs: int, order: str) -> dict:
    """Per rule: runs stopped by the look at each k (cumulative: any look up to k)."""
    stopped = {rule: dict.fromkeys(LOOKS, 0) for rule in RULES}
    for _ in range(runs):
        answers = sim.answers(IN_FLIGHT, HEALTHY, share)
        if order == "completion":  # the first to finish are the shortest of those in flight
            answers = answers.take(np.argsort(answers.tokens, kind="stable"))
        done = dict.fromkeys(RULES, False)
        for k in LOOKS:
            results = judge(answers.take(np.arange(k)), disaster)
            for rule, blocks in RULES.items():
                done[rule] = done[rule] or any(blocks(r) for r in results)
                stopped[rule][k] += done[rule]
    return stopped


def per_1000(count: int, total: int) -> str:
    return f"{1000 * count / total:.1f}" if count else "0"


def report(args: argparse.Namespace) -> str:
    disaster = disaster_figures()
    sim = Simulator(args.seed, disaster)
    rehearsal = Simulator(args.seed + 1, disaster, REHEARSAL_LENGTHS)
    started = time.perf_counter()
    healthy = {rows: false_blocks(sim, disaster, rows, HEALTHY, args.shards) for rows in SIZES}
    rehearsal_64 = false_blocks(rehearsal, disaster, 64, HEALTHY, args.shards)
    half = {rows: false_blocks(sim, disaster, rows, HALF_LIMITS, args.shards) for rows in SIZES}
    worst = {rows: worst_case(rows) for rows in SIZES}
    print(f"healthy shards judged in {time.perf_counter() - started:.0f} s")

    def cell(counts: dict, gate: str) -> str:
        return f"{per_1000(counts[gate, 'fixed'], args.shards)} → {per_1000(counts[gate, 'evidence'], args.shards)}"

    lines = [
        "Each answer-level gate under the rule before `training.evidence` (**fixed**: a share over its limit blocks)",
        "and its own (**evidence**: blocks only when the true share is above the limit at a false-block rate of",
        "1 in 10,000, for the sample at hand), measured in the same run on the same simulated shards",
        f"(`python -m benchmarks.bench_gates --shards {args.shards} --runs {args.runs}`). Answer lengths: the",
        f"simulator's `{LENGTHS}` (mean {MEAN_OUTPUT_TOKENS:,} tokens, sigma {SIGMA}, capped at {MAX_NEW_TOKENS:,}).",
        f"Healthy defects per answer (assumed, each inside its limit): errors {HEALTHY.error:.1%}, length-capped",
        f"{HEALTHY.runaway:.0%}, under 32 tokens {HEALTHY.trivial:.1%}, a visible answer under 8 characters",
        f"{HEALTHY.short:.0%} (from {len(SHORT_POOL)} common ones), empty {HEALTHY.empty:.1%}, no `</think>`",
        f"{HEALTHY.broken_thinking:.1%}. Half the limits: every share at half its gate's limit, and one length and one",
        "answer on 2.5% of rows each. The rehearsal's lengths: its `uniform:48:160` (113 values), with the healthy",
        "defects.",
        "",
        f"False blocks per 1,000 shards (fixed → evidence), {args.shards:,} shards a cell; the last columns are the",
        "evidence rule's exact worst case, the true share at the limit itself:",
        "",
        "| gate | healthy, 64 rows | healthy, 500 rows | rehearsal lengths, 64 rows | half the limits, 64 | "
        "half the limits, 500 | at the limit, 64 | at the limit, 500 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for gate in GATES:
        lines.append(
            f"| `{gate}` | {cell(healthy[64], gate)} | {cell(healthy[500], gate)} | {cell(rehearsal_64, gate)} | "
            f"{cell(half[64], gate)} | {cell(half[500], gate)} | {1000 * worst[64][gate]:.2f} | "
            f"{1000 * worst[500][gate]:.2f} |"
        )

    started = time.perf_counter()
    seed_blocked = {rows: shards_blocked(sim, disaster, rows, SEED_SHARE, args.runs) for rows in DISASTER_SIZES}
    lines += [
        "",
        f"The seed's disaster at {SEED_SHARE:.0%} of answers (each answer drawn; {args.runs:,} shards a size):",
        "shards blocked by any gate, and by all five answer gates (floor, concentration, thinking, degenerate, short):",
        "",
        "| rows | fixed: any | fixed: all five | evidence: any | evidence: all five |",
        "|---|---|---|---|---|",
    ]
    for rows, blocked in seed_blocked.items():
        lines.append(
            f"| {rows} | {blocked['any']['fixed']}/{args.runs} | {blocked['all_five']['fixed']}/{args.runs} | "
            f"{blocked['any']['evidence']}/{args.runs} | {blocked['all_five']['evidence']}/{args.runs} |"
        )
    print(f"disaster shards judged in {time.perf_counter() - started:.0f} s")

    started = time.perf_counter()
    lines += [
        "",
        "The watch: the gates applied to the first k answers of a run (looks at k = 50, 100, 200; a run counts as",
        f"stopped at k if any look up to k blocked), {args.runs:,} runs a row, in dispatch order and in completion",
        f"order (the fleet starts {IN_FLIGHT} requests at once; the first to finish are the shortest, the",
        "disaster's 6-token answers first):",
        "",
        "| answers | order | fixed: by 50 / 100 / 200 | evidence: by 50 / 100 / 200 |",
        "|---|---|---|---|",
    ]
    smallest: dict[tuple[str, str], str | None] = {}
    for order in ORDERS:
        for label, share in (("healthy", 0.0), (f"disaster {SEED_SHARE:.0%}", SEED_SHARE)):
            stopped = watch(sim, disaster, share, args.runs, order)
            lines.append(
                f"| {label} | {order} | "
                + " | ".join(" / ".join(f"{stopped[rule][k]}" for k in LOOKS) for rule in RULES)
                + " |"
            )
        for rule in RULES:
            smallest[order, rule] = None
        for share in MIXED_SHARES:  # ascending: a larger share is stopped at least as surely
            if all(smallest[order, rule] for rule in RULES):
                break
            stopped = watch(sim, disaster, share, args.runs, order)
            for rule in RULES:
                if smallest[order, rule] is None and stopped[rule][LOOKS[-1]] >= STOPPED * args.runs:
                    smallest[order, rule] = f"{share:.0%}"
    print(f"watch runs judged in {time.perf_counter() - started:.0f} s")
    beyond = f"over {MIXED_SHARES[-1]:.0%}"
    lines += [
        "",
        f"The smallest disaster share (of {', '.join(f'{s:.0%}' for s in MIXED_SHARES)}) mixed into healthy answers",
        f"that the watch stops within its first {LOOKS[-1]} answers in {STOPPED:.0%} of {args.runs:,} runs:",
        "",
        "| order | fixed | evidence |",
        "|---|---|---|",
        *(f"| {order} | " + " | ".join(smallest[order, rule] or beyond for rule in RULES) + " |" for order in ORDERS),
    ]
    lines += [
        "",
        "Reading it: the fixed rule judged a share without its sample, so a small sample over the limit by chance",
        "blocked (one broken answer of 64 is 1.6% > 1%); the evidence rule blocks none of these healthy shards, nor",
        "any healthy run of the watch, at a cost in sensitivity to a small disaster share early in a run (less in",
        "completion order, where the disaster's short answers arrive first). The seed's disaster is blocked by all",
        "five answer gates at every size from 20 rows, and stopped at the watch's first look.",
    ]
    return "## Gates: false blocks on healthy shards, the disaster stopped\n\n" + "\n".join(lines) + "\n"


# ---- the watch's false holds at the job's scale ------------------------------------------------------------

JOB_ANSWERS = 913_786  # the real job's answers
WATCH = WatchOptions()  # judged every `watch_judge_every` answers, once `watch_min_answers` are in
JOB_GOAL = 1  # false holds per 1,000 healthy jobs, at most
DISASTER_SUM = 6  # the seed's loss_mask sum: empty reasoning and "OK."
ONE_LENGTH = f"fixed:{DISASTER_SUM}"
CONTROL_JOBS = 100  # the control holds every job: fewer of them show it


def job_lengths(spec: str, rng: np.random.Generator, answers: int) -> np.ndarray:
    """`answers` output lengths from the simulator's distribution `spec` (as `parse_length_distribution` reads it,
    drawn by numpy: a job's 913,786 draws one by one would take seconds)."""
    kind, *args = spec.split(":")
    if kind == "fixed":
        return np.full(answers, int(args[0]), dtype=np.int64)
    if kind == "uniform":
        return rng.integers(int(args[0]), int(args[1]) + 1, answers)
    median, sigma = map(float, args)
    return np.floor(rng.lognormal(math.log(median), sigma, answers)).astype(np.int64)


def job_rows(spec: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A healthy job's answers in order: each one's supervised length, and whether it is a training row (not an
    error, not length-capped), with the healthy defects of `HEALTHY`."""
    lengths = np.maximum(job_lengths(spec, rng, JOB_ANSWERS), 1)
    draw = rng.random(JOB_ANSWERS)
    trivial = draw < HEALTHY.trivial
    lengths[trivial] = rng.integers(8, LIMITS.loss_floor, int(trivial.sum()))
    kept = (draw >= HEALTHY.trivial + HEALTHY.error + HEALTHY.runaway) | trivial
    return lengths, kept & (lengths < MAX_NEW_TOKENS)


def job_holds(lengths: np.ndarray, kept: np.ndarray) -> tuple[dict[str, bool], int, int]:
    """Whether the watch's `loss_sum_concentration` held this job, per rule, judged every `watch_judge_every`
    answers over its last `WINDOW`; and the largest count on one sum in a full window, with the smallest count that
    holds in one. Windows filling (the first `WINDOW` answers) are judged by `gates.concentration_gate` itself; full
    ones by their largest count on one sum in *any* window of `WINDOW` answers (every one, not every 25th: an upper
    bound) against the smallest count that holds at the fewest training rows a full window has, and the window with
    that largest count is judged by the gate too."""
    held = dict.fromkeys(RULES, False)
    for end in range(WATCH.watch_min_answers, WINDOW, WATCH.watch_judge_every):
        result = gates.concentration_gate(lengths[:end][kept[:end]], LIMITS)
        for rule, blocks in RULES.items():
            held[rule] = held[rule] or blocks(result)
    positions = np.flatnonzero(kept)
    keys = np.sort(lengths[positions] * (JOB_ANSWERS + WINDOW + 1) + positions)
    in_window = np.searchsorted(keys, keys + WINDOW) - np.arange(keys.size)  # its sum's rows in the next WINDOW
    top = int(in_window.max())
    rows = np.cumsum(kept)
    fewest = int((rows[WINDOW - 1 :] - np.concatenate([[0], rows[:-WINDOW]])).min())
    holds_from = evidence.weigh(
        0, fewest, LIMITS.max_top_loss_sum_share, among_many=True, min_count=LIMITS.min_repeats
    ).blocks_from
    start = int(keys[int(in_window.argmax())] % (JOB_ANSWERS + WINDOW + 1))
    worst = gates.concentration_gate(lengths[start : start + WINDOW][kept[start : start + WINDOW]], LIMITS)
    held["evidence"] = held["evidence"] or not worst.passed or (holds_from is not None and top >= holds_from)
    held["fixed"] = held["fixed"] or fixed_rule_blocks(worst)
    return held, top, holds_from or 0


def watch_report(args: argparse.Namespace) -> str:
    rng = np.random.default_rng(args.seed)
    judged = (JOB_ANSWERS - WATCH.watch_min_answers) // WATCH.watch_judge_every + 1
    lines = [
        "The quality watch holds the line on `loss_sum_concentration` by the `training_set_gates` check's",
        f"thresholds (defaults: {percent(LIMITS.max_top_loss_sum_share)} on one loss_mask sum, at least",
        f"{LIMITS.min_repeats} rows). A healthy job: {JOB_ANSWERS:,} answers, judged every",
        f"{WATCH.watch_judge_every} answers once {WATCH.watch_min_answers} are in ({judged:,} looks a job) over the",
        f"watch's window of its last {WINDOW:,}, its training rows only (errors {HEALTHY.error:.1%} and",
        f"length-capped answers {HEALTHY.runaway:.0%} left out; {HEALTHY.trivial:.1%} under 32 tokens). Lengths are",
        "drawn with numpy from the simulator's distributions; the verdicts are the gate's own",
        "(`gates.concentration_gate`, `training.evidence`), full windows bounded from above (every window, not every",
        f"25th). **fixed**: the rule before `training.evidence`, on the same windows. Goal: at most {JOB_GOAL} false",
        f"hold per 1,000 healthy jobs (`python -m benchmarks.bench_gates --watch-jobs {args.watch_jobs}`).",
        "",
        "| answer lengths | jobs | held, fixed | held, evidence | per 1,000 jobs (evidence) | "
        "largest count on one sum in a full window | count that holds there |",
        "|---|---|---|---|---|---|---|",
    ]
    for spec in (LENGTHS, REHEARSAL_LENGTHS, ONE_LENGTH):
        started = time.perf_counter()
        held = dict.fromkeys(RULES, 0)
        tops, holds_from = [], []
        jobs = args.watch_jobs if spec != ONE_LENGTH else min(args.watch_jobs, CONTROL_JOBS)
        for _ in range(jobs):
            verdicts, top, first = job_holds(*job_rows(spec, rng))
            for rule in RULES:
                held[rule] += verdicts[rule]
            tops.append(top)
            holds_from.append(first)
        print(f"{jobs} jobs of {spec} judged in {time.perf_counter() - started:.0f} s")
        lines.append(
            f"| `{spec}` | {jobs:,} | {held['fixed']} | {held['evidence']} | "
            f"{per_1000(held['evidence'], jobs)} | {max(tops)} | {min(holds_from)} |"
        )
    lines += [
        "",
        "Reading it: the first two rows are healthy jobs, so every hold there is a false one; natural lengths spread,",
        "and no sum comes near the count that holds in a full window. The last row is the control, the seed's",
        f"signature (`{ONE_LENGTH}`: every answer loss_mask sum {DISASTER_SUM}): every job held, at its first look.",
    ]
    return "## Gates: the watch's false holds at the job's scale\n\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=5000, help="healthy shards per cell (at least 1,000)")
    parser.add_argument("--runs", type=int, default=1000, help="disaster shards per size and watch runs per row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--watch-jobs", type=int, default=1000, help="healthy jobs the watch judges per length")
    parser.add_argument("--watch-only", action="store_true", help="only the watch's false holds at the job's scale")
    parser.add_argument("--no-write", action="store_true", help="print the section without writing BENCHMARKS.md")
    args = parser.parse_args()
    watched = watch_report(args)
    print(watched if args.no_write else f"{watched}\nwritten to {write_section('gates_watch', watched)}")
    if args.watch_only:
        return
    markdown = report(args)
    print(markdown if args.no_write else f"{markdown}\nwritten to {write_section('gates', markdown)}")


if __name__ == "__main__":
    main()
