"""`dflash tune`: how many requests each server should run at once, measured rather than guessed.

A sweep sends real prompts (a sample of the published conversations, rendered as generation renders them) or
synthetic prompts of the observed length, at one client concurrency per server after another, and measures
at each point the fleet's output tokens/s in steady state, the accept length, TTFT and per-request latency
(p50, p99). In launch mode the servers are restarted between server settings (caps, memory flags; for
simulators, other `SimConfig` options), and every setting gets its own concurrency sweep.

The **knee** is the least concurrency whose throughput reaches `knee_fraction` (95%) of the curve's best over
the swept range: beyond it more requests in flight buy little but latency. It is read off a saturating model
fitted to every point (`ops.knee`, which defines it precisely), not off the noisy best measurement. After a
coarse sweep (powers of two up to the server's cap, the cap, and 1.25x it), the refinement measures the
estimated knee and repeats points where the curve is flat until the knee's bootstrap interval is narrow. The
report gives the points, the knee with its interval, the flags that run there, and a chart (SVG);
`tune_render.write_report` keeps it in the store (`tuning/report.json`) for `status` and the `fleet_tuning` asset.

How one point is measured (the steady-state window) is `ops.tune_point`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dagster_project.conversations.shards import read_conversations, read_conversations_manifest
from dagster_project.conversations.turns import prompt_messages
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops import knee as knee_fit
from dagster_project.ops import spec_compare
from dagster_project.ops.tune_point import TunePoint, run_point, summarize
from dagster_project.sglang import capacity, speculative
from dagster_project.store.dataclass_json import from_json
from dagster_project.store.storage import Store
from dagster_project.tokenizer import render_prompt_ids

if TYPE_CHECKING:
    from dagster_project.sglang.model_identity import ModelIdentity

REPORT_KEY = "tuning/report.json"
AS_RUNNING = "as running"  # the label of the one server setting of connect mode
AS_LAUNCHED = "as launched"  # and of launch mode without a sweep


@dataclass(frozen=True)
class TuneOptions:
    """How a sweep runs (the `fleet_tuning` asset's config and `dflash tune`'s flags)."""

    concurrencies: list[int] = field(
        default_factory=list,
        metadata={"help": "Client concurrencies per server to measure; empty: powers of two up to 1.25x the cap."},
    )
    rounds: int = field(default=4, metadata={"help": "Requests per point and server: rounds x concurrency."})
    min_requests: int = field(default=8, metadata={"help": "At least this many requests per point and server."})
    knee_fraction: float = field(
        default=0.95, metadata={"help": "The knee: the least concurrency reaching this share of the best tok/s."}
    )
    refine: int = field(
        default=6,
        metadata={"help": "Extra points that narrow the knee down: the estimated knee, then repeats where flat."},
    )
    sample: int = field(default=256, metadata={"help": "Prompts sampled from the published conversations."})
    synthetic_prompt_tokens: int = field(
        default=0, metadata={"help": "Synthetic prompts of this many tokens instead of the conversations; 0: none."}
    )
    max_new_tokens: int = field(default=0, metadata={"help": "Answer cap per request; 0: the generation settings'."})
    ignore_eos: bool = field(
        default=False, metadata={"help": "Write max_new_tokens every time (random weights never stop by themselves)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the prompt sample."})
    request_timeout_s: float = field(default=3600.0, metadata={"help": "Seconds one request may take."})
    spec_settings: str = field(
        default="off,1/1/2,2/1/3,4/1/5",
        metadata={
            "help": "Launch mode: speculative settings (off, or steps/topk/draft-tokens) measured at the knee "
            "against the one launched; empty: none."
        },
    )

    def __post_init__(self) -> None:
        if not 0 < self.knee_fraction <= 1 or self.rounds < 1 or self.min_requests < 1:
            raise ValueError("knee_fraction must be in (0, 1], rounds and min_requests >= 1")
        if any(c < 1 for c in self.concurrencies):
            raise ValueError(f"concurrencies must be >= 1, got {self.concurrencies}")
        speculative.parse_list(self.spec_settings)  # a bad setting fails before any server starts

    def requests_per_server(self, concurrency: int) -> int:
        return max(self.min_requests, self.rounds * concurrency)


# ---- prompts --------------------------------------------------------------------------------------------------


def conversation_prompts(
    store: Store, tokenizer: Any, settings: GenerationSettings, count: int, seed: int = 0
) -> list[list[int]]:
    """Up to `count` first-turn prompts of the published conversations, rendered as generation renders them
    (chat template, thinking flags), from shards taken in a seeded random order."""
    manifest = read_conversations_manifest(store)
    if manifest is None:
        raise ValueError("no published conversations to sample prompts from: materialize `conversations`")
    rng = random.Random(seed)
    shards = list(range(manifest.num_shards))
    rng.shuffle(shards)
    prompts: list[list[int]] = []
    for shard in shards:
        conversations = list(read_conversations(store, shard))
        rng.shuffle(conversations)
        for conversation in conversations[: count - len(prompts)]:
            messages = prompt_messages(conversation, 0, [])
            prompts.append(
                render_prompt_ids(
                    tokenizer,
                    messages,
                    enable_thinking=settings.enable_thinking,
                    preserve_thinking=settings.preserve_thinking,
                    tools=conversation.tools,
                )
            )
        if len(prompts) >= count:
            break
    if not prompts:
        raise ValueError("the published conversations hold no prompt")
    return prompts


def synthetic_prompts(tokenizer: Any, count: int, tokens: int, seed: int = 0) -> list[list[int]]:
    """`count` distinct prompts of exactly `tokens` ordinary token ids of `tokenizer`'s vocabulary (no prefix shared
    between them): from `_SYNTHETIC_IDS`, below its first added token there (a control token of its model)."""
    start, stop = _SYNTHETIC_IDS.start, _SYNTHETIC_IDS.stop
    added = [token_id for token_id in tokenizer.added_tokens_decoder if token_id >= start]
    stop = min(stop, len(tokenizer), *added)
    rng = random.Random(seed)
    return [[rng.randrange(start, stop) for _ in range(tokens)] for _ in range(count)]


# Where synthetic prompts draw their ids: past the first thousand (Mistral's tekken holds its control tokens there),
# and below Qwen3.6's 150,000 at most.
_SYNTHETIC_IDS = range(1000, 150_000)


# ---- the sweep ------------------------------------------------------------------------------------------------


def coarse_concurrencies(cap: int | None, given: Sequence[int] = ()) -> list[int]:
    """The given concurrencies, else powers of two up to the cap, the cap and 1.25x it (past the cap requests
    only queue: the point shows the plateau)."""
    if given:
        return sorted(set(given))
    top = cap or 64
    points = {1 << k for k in range(int(math.log2(top)) + 1)} | {top, math.ceil(top * 1.25)}
    return sorted(points)


def samples(points: Sequence[TunePoint], server_setting: str | None = None) -> list[tuple[int, float]]:
    """(concurrency, output tok/s) of the points (of one server setting), repeats included: what the knee is
    fitted to."""
    return [(p.concurrency, p.output_tok_per_s) for p in points if server_setting in (None, p.server_setting)]


def sweep_points(
    label: str, cap: int | None, options: TuneOptions, measure: Callable[[int], TunePoint]
) -> list[TunePoint]:
    """The coarse concurrencies, then up to `options.refine` more (`knee.next_probe`: the estimated knee, then
    repeats where the curve is flat), and the final estimate's knee if still unmeasured; `measure` runs one
    point."""
    points = [measure(c) for c in coarse_concurrencies(cap, options.concurrencies)]
    for _ in range(options.refine):
        probe = knee_fit.next_probe(samples(points), cap, options.knee_fraction)
        if probe is None:
            break
        points.append(measure(probe))
    estimate = knee_fit.estimate_knee(samples(points), cap, options.knee_fraction, server_setting=label)
    if estimate is not None and estimate.concurrency not in {p.concurrency for p in points}:
        points.append(measure(estimate.concurrency))
    return sorted(points, key=lambda p: p.concurrency)


def choose_knee(
    points: Sequence[TunePoint], fraction: float
) -> tuple[knee_fit.KneeEstimate | None, list[knee_fit.KneeEstimate]]:
    """(the knee to launch at, every server setting's estimate): of the settings whose fitted best reaches
    `fraction` of the best of all, the one with the least knee (then the least cap)."""
    estimates = []
    for label in dict.fromkeys(p.server_setting for p in points):
        cap = min((p.cap for p in points if p.server_setting == label and p.cap), default=None)
        estimate = knee_fit.estimate_knee(samples(points, label), cap, fraction, server_setting=label)
        if estimate is not None:
            estimates.append(estimate)
    if not estimates:
        return None, []
    best = max(e.peak for e in estimates)
    caps = {p.server_setting: p.cap or 0 for p in points}
    reaching = [e for e in estimates if e.peak >= fraction * best]
    return min(reaching, key=lambda e: (e.concurrency, caps[e.server_setting])), estimates


def knee_point(points: Sequence[TunePoint], estimate: knee_fit.KneeEstimate | None) -> TunePoint | None:
    """The measured point of the estimate's setting at its knee (the nearest one if the knee was not measured;
    the last of repeats)."""
    if estimate is None:
        return None
    curve = [p for p in points if p.server_setting == estimate.server_setting]
    return min(reversed(curve), key=lambda p: abs(p.concurrency - estimate.concurrency), default=None)


@dataclass(frozen=True)
class ServerSetting:
    """One server configuration of a launch-mode sweep: a label and the options it launches with."""

    label: str
    options: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)  # the launch flags it stands for, for the recommendation


# Launches the fleet under a setting, yields its endpoints, stops it on exit.
Launcher = Callable[[ServerSetting], AbstractContextManager[list[str]]]
# The launch options that serve a speculative setting (None: MTP off), in the launcher's terms.
SpecOptions = Callable[[speculative.SpecSetting | None], dict[str, Any]]


@dataclass(frozen=True)
class TuneReport:
    """A sweep's points, its knee and what to launch with."""

    created_at: float
    endpoints: list[str]
    prompts_source: str
    prompts: int
    knee_fraction: float
    points: list[TunePoint]
    knee: TunePoint | None  # the measured point at the recommended knee
    best_output_tok_per_s: float
    recommended_flags: list[str]
    recommendation: str
    capacity: dict[str, str] = field(default_factory=dict)  # per server setting: `capacity.analyze(...).explain()`
    options: dict[str, Any] = field(default_factory=dict)
    knee_estimate: knee_fit.KneeEstimate | None = None  # the fitted knee, its interval and its fit
    estimates: list[knee_fit.KneeEstimate] = field(default_factory=list)  # every server setting's
    speculative: spec_compare.SpecComparison | None = None  # MTP on vs off and other settings, at the knee

    def curve(self, server_setting: str | None = None) -> list[TunePoint]:
        """The points of one server setting (default: the knee's), by concurrency."""
        label = server_setting or (self.knee.server_setting if self.knee else None)
        return sorted((p for p in self.points if p.server_setting == label), key=lambda p: p.concurrency)

    def throughput_at(self, concurrency: float, server_setting: str | None = None) -> tuple[float, float | None]:
        """(output tok/s, accept length) at `concurrency` on one setting's curve (`interpolate`)."""
        return interpolate(self.curve(server_setting), concurrency)


def interpolate(curve: Sequence[TunePoint], concurrency: float) -> tuple[float, float | None]:
    """(output tok/s, accept length) at `concurrency`, interpolated between the measured points of one setting's
    curve, by concurrency (repeats averaged); outside the measured range, raises `LookupError`."""
    merged = _averaged(curve)
    for low, high in zip(merged, merged[1:] or merged):
        if low.concurrency <= concurrency <= high.concurrency:
            span = high.concurrency - low.concurrency
            weight = (concurrency - low.concurrency) / span if span else 0.0
            rate = low.output_tok_per_s + weight * (high.output_tok_per_s - low.output_tok_per_s)
            accepts = (low.accept_length, high.accept_length)
            accept = accepts[0] + weight * (accepts[1] - accepts[0]) if None not in accepts else None
            return rate, accept
    raise LookupError(f"concurrency {concurrency} is outside the measured points")


def _averaged(curve: Sequence[TunePoint]) -> list[TunePoint]:
    """One point per concurrency: repeats of a point averaged (throughput and accept length)."""
    merged = []
    for _, group in itertools.groupby(curve, key=lambda p: p.concurrency):
        repeats = list(group)
        accepts = [p.accept_length for p in repeats]
        merged.append(
            replace(
                repeats[0],
                output_tok_per_s=statistics.fmean(p.output_tok_per_s for p in repeats),
                accept_length=None if None in accepts else statistics.fmean(a for a in accepts if a is not None),
            )
        )
    return merged


def sweep_concurrency(
    urls: Sequence[str],
    label: str,
    cap: int | None,
    prompts: Sequence[Sequence[int]],
    params: Mapping[str, Any],
    options: TuneOptions,
    *,
    api_key: str | None = None,
    expected_model: ModelIdentity | None = None,
    log: Callable[[str], None] = print,
) -> list[TunePoint]:
    """`sweep_points` against the servers at `urls` as they run."""

    def measure(concurrency: int) -> TunePoint:
        return measure_point(
            urls, label, cap, concurrency, prompts, params, options,
            api_key=api_key, expected_model=expected_model, log=log,
        )  # fmt: skip

    return sweep_points(label, cap, options, measure)


def measure_point(
    urls: Sequence[str],
    label: str,
    cap: int | None,
    concurrency: int,
    prompts: Sequence[Sequence[int]],
    params: Mapping[str, Any],
    options: TuneOptions,
    *,
    api_key: str | None = None,
    expected_model: ModelIdentity | None = None,
    log: Callable[[str], None] = print,
) -> TunePoint:
    """One point: `concurrency` requests in flight per server at `urls`, in steady state; nothing is sent to servers
    that do not serve `expected_model` (`run_point`)."""
    requests = options.requests_per_server(concurrency)
    records = asyncio.run(
        run_point(
            urls,
            prompts,
            params,
            concurrency,
            requests,
            api_key=api_key,
            timeout_s=options.request_timeout_s,
            expected_model=expected_model,
        )  # fmt: skip
    )
    point = summarize(records, server_setting=label, concurrency=concurrency, cap=cap)
    log(_point_line(point))
    return point


def sweep(
    settings: Sequence[ServerSetting],
    prompts: Sequence[Sequence[int]],
    params: Mapping[str, Any],
    options: TuneOptions,
    *,
    endpoints: Sequence[str] = (),
    launcher: Launcher | None = None,
    api_key: str | None = None,
    prompts_source: str = "",
    spec_options: SpecOptions | None = None,
    expected_model: ModelIdentity | None = None,
    log: Callable[[str], None] = print,
) -> TuneReport:
    """Measure every server setting (launched in turn by `launcher`, or the running `endpoints` as they are),
    narrow the knee down, recommend, and compare speculative settings at the knee (`compare_speculative`). Every
    server must serve `expected_model` (None: not checked) before it is sent a prompt."""
    if launcher is None and not endpoints:
        raise ValueError("nothing to tune: no endpoints and no launcher")
    points: list[TunePoint] = []
    explained: dict[str, str] = {}
    used: list[str] = list(endpoints)
    flags_of = {setting.label: setting.flags for setting in settings}
    spec_of: dict[str, str] = {}  # the speculative setting each server setting ran, as its server reports it
    for setting in settings or [ServerSetting(AS_RUNNING)]:
        with _serving(setting, launcher, endpoints) as urls:
            used = list(urls)
            infos = asyncio.run(_server_infos(urls, api_key))
            running = speculative.of_server_info(next((i for i in infos if i), None))
            spec_of[setting.label] = running if isinstance(running, str) else speculative.label(running)
            cap = min((c for c in map(_cap, infos) if c), default=None)
            log(f"tune [{setting.label}]: {len(urls)} servers, running cap {cap}")
            measured = sweep_concurrency(
                urls, setting.label, cap, prompts, params, options,
                api_key=api_key, expected_model=expected_model, log=log,
            )  # fmt: skip
            explained[setting.label] = _explain(infos, measured)
            log(f"tune [{setting.label}]: {explained[setting.label]}")
            points += measured
    estimate, estimates = choose_knee(points, options.knee_fraction)
    best = max((p.output_tok_per_s for p in points), default=0.0)
    flags, text = recommend(estimate, flags_of.get(estimate.server_setting, []) if estimate else [])
    comparison = None
    if estimate is not None:
        setting = next((s for s in settings if s.label == estimate.server_setting), ServerSetting(AS_RUNNING))
        comparison = compare_speculative(
            points, estimate, setting, spec_of.get(setting.label, "unknown"), prompts, params, options,
            launcher=launcher if spec_options is not None else None, spec_options=spec_options,
            api_key=api_key, expected_model=expected_model, log=log,
        )  # fmt: skip
    return TuneReport(
        created_at=time.time(),
        endpoints=used,
        prompts_source=prompts_source,
        prompts=len(prompts),
        knee_fraction=options.knee_fraction,
        points=points,
        knee=knee_point(points, estimate),
        best_output_tok_per_s=best,
        recommended_flags=flags,
        recommendation=text,
        capacity=explained,
        options=asdict(options),
        knee_estimate=estimate,
        estimates=estimates,
        speculative=comparison,
    )


def compare_speculative(
    points: Sequence[TunePoint],
    estimate: knee_fit.KneeEstimate,
    setting: ServerSetting,
    launched: str,
    prompts: Sequence[Sequence[int]],
    params: Mapping[str, Any],
    options: TuneOptions,
    *,
    launcher: Launcher | None,
    spec_options: SpecOptions | None,
    api_key: str | None = None,
    expected_model: ModelIdentity | None = None,
    log: Callable[[str], None] = print,
) -> spec_compare.SpecComparison:
    """The knee's server setting relaunched once per speculative setting of `options.spec_settings` (the one it
    ran, `launched`, excepted), sized as the launcher sizes any launch, and measured at the recommended
    concurrency against the sweep's own measurement there. Without a launcher (connect mode): not measured, and
    said so."""
    cap = estimate.fit.cap
    running = min(estimate.concurrency, cap) if cap else estimate.concurrency
    curve = sorted((p for p in points if p.server_setting == setting.label), key=lambda p: p.concurrency)
    rate, accept = interpolate(curve, running)
    if launcher is None or spec_options is None:
        return spec_compare.not_measured(running, launched, accept)
    trials = [spec_compare.SpecTrial(launched, rate, accept, baseline=True)]
    for spec in speculative.parse_list(options.spec_settings):
        name = speculative.label(spec)
        if name == launched:
            continue
        trial = ServerSetting(f"{setting.label}, speculative {name}", {**setting.options, **spec_options(spec)})
        with launcher(trial) as urls:
            cap = min((c for c in map(_cap, asyncio.run(_server_infos(urls, api_key))) if c), default=None)
            point = measure_point(
                urls, trial.label, cap, running, prompts, params, options,
                api_key=api_key, expected_model=expected_model, log=log,
            )  # fmt: skip
        ran = min(running, cap) if cap else running  # a setting whose memory runs fewer at once says so
        trials.append(spec_compare.SpecTrial(name, point.output_tok_per_s, point.accept_length, point.errors, ran))
    comparison = spec_compare.compare(running, trials, estimate.residual)
    log(f"tune [speculative]: {comparison.verdict}")
    return comparison


def recommend(estimate: knee_fit.KneeEstimate | None, setting_flags: Sequence[str]) -> tuple[list[str], str]:
    """The SGLang launch flags that run at the knee, and a sentence saying why, with the knee's uncertainty.

    A server runs at most its cap whatever the client sends (the dispatcher's window is the cap times its
    oversubscription), so running at the knee means a cap at the knee: `--max-running-requests`, with the radix
    cache off so that the state pool is exactly that many slots and the rest of the memory is KV pool.
    """
    if estimate is None:
        return [], "no point produced output: check the servers (the report has the errors per point)"
    cap = estimate.fit.cap
    share = estimate.rate / estimate.peak if estimate.peak else 0.0
    head = (
        f"knee at {estimate.concurrency} requests per server ({estimate.uncertainty}): "
        f"{estimate.rate:,.0f} output tok/s fitted, {share:.0%} of the fitted best {estimate.peak:,.0f} "
        f"({estimate.points} points, fit within ±{estimate.residual:.1%} RMS)"
    )
    flags = list(setting_flags)
    at_cap = cap is not None and estimate.concurrency >= cap
    running = cap if at_cap and cap is not None else estimate.concurrency
    if "--max-running-requests" in flags:
        flags[flags.index("--max-running-requests") + 1] = str(running)
    else:
        flags += ["--max-running-requests", str(running)]
    if "--radix-cache" not in flags and "--disable-radix-cache" not in flags:
        flags.insert(0, "--disable-radix-cache")
    if at_cap:
        return flags, (
            f"{head}, reached only at the servers' cap {cap}: the cap binds, so more concurrency would pay "
            "if the memory allowed it (`dflash status`, question 3, says which flags raise the cap and at what cost)"
        )
    if estimate.peak_at == estimate.highest and (cap is None or estimate.highest < cap):
        return flags, (
            f"{head}, with the fitted curve still rising at the highest concurrency measured, below the cap "
            f"({cap if cap is not None else 'unknown'}); measure higher concurrencies before settling"
        )
    return flags, (
        f"{head}; more requests at once add latency for under {1 - share:.0%} more throughput, and a cap at the knee "
        "leaves the rest of the memory to the KV pool"
    )


def _serving(
    setting: ServerSetting, launcher: Launcher | None, endpoints: Sequence[str]
) -> AbstractContextManager[list[str]]:
    """The servers of `setting`: launched for it, or the running ones as they are."""
    return launcher(setting) if launcher is not None else nullcontext(list(endpoints))


async def _server_infos(urls: Sequence[str], api_key: str | None) -> list[dict | None]:
    from dagster_project.sglang.client import SGLangClient, SGLangError, new_session

    async with new_session() as session:

        async def one(url: str) -> dict | None:
            try:
                return await SGLangClient(url, api_key, session).server_info()
            except SGLangError:
                return None

        return list(await asyncio.gather(*(one(url) for url in urls)))


def _cap(info: Mapping[str, Any] | None) -> int | None:
    states = (info or {}).get("internal_states") or [{}]
    cap = states[0].get("effective_max_running_requests_per_dp")
    return cap if isinstance(cap, int) and cap > 0 else None


def _explain(infos: Sequence[dict | None], points: Sequence[TunePoint]) -> str:
    """What binds the first server's cap at the request lengths the sweep measured."""
    info = next((i for i in infos if i), None)
    done = [p for p in points if p.requests > p.errors]
    if info is None or not done:
        return "no /server_info" if info is None else "no request finished"
    prompt = statistics.fmean(p.mean_prompt_tokens for p in done)
    output = statistics.fmean(p.mean_output_tokens for p in done)
    try:
        return capacity.analyze(info, prompt, output).explain()
    except (KeyError, TypeError, ValueError):
        return "no capacity fields in /server_info"


def _point_line(point: TunePoint) -> str:
    accept = f"{point.accept_length:.2f}" if point.accept_length else "—"
    ttft = f"{point.ttft_p50_s * 1000:.0f} ms" if point.ttft_p50_s is not None else "—"
    latency = f"{point.latency_p50_s:.2f}/{point.latency_p99_s:.2f} s" if point.latency_p50_s is not None else "—"
    return (
        f"  concurrency {point.concurrency:>4}: {point.output_tok_per_s:>10,.0f} out tok/s, "
        f"{point.req_per_s:6.2f} req/s, accept {accept}, TTFT p50 {ttft}, latency p50/p99 {latency}, "
        f"errors {point.errors}"
    )


def launch_settings_grid(
    sweeps: Mapping[str, Sequence[Any]], flag_of: Callable[[str, Any], list[str]]
) -> list[ServerSetting]:
    """Every combination of the swept option values, labelled by them; `flag_of(name, value)` gives the launch
    flags each value stands for."""
    combos: list[dict[str, Any]] = [{}]
    for name, values in sweeps.items():
        combos = [{**combo, name: value} for combo in combos for value in values]
    settings = []
    for combo in combos:
        label = ", ".join(f"{name}={value}" for name, value in combo.items()) or AS_LAUNCHED
        flags = [flag for name, value in combo.items() for flag in flag_of(name, value)]
        settings.append(ServerSetting(label, combo, flags))
    return settings


def request_params(settings: GenerationSettings, options: TuneOptions) -> dict[str, Any]:
    """The generation settings' sampling parameters, with the sweep's answer cap and `ignore_eos`."""
    params = settings.sampling_params()
    if options.max_new_tokens:
        params["max_new_tokens"] = options.max_new_tokens
    if options.ignore_eos:
        params["ignore_eos"] = True
    return params


# ---- the report -----------------------------------------------------------------------------------------------


def read_report(store: Store) -> TuneReport | None:
    raw = store.get_bytes(REPORT_KEY) if store.exists(REPORT_KEY) else None
    return from_json(TuneReport, raw) if raw is not None else None


def gain(
    report: TuneReport, from_concurrency: int, to_concurrency: int
) -> tuple[float, float | None, float | None, int]:
    """Measured output tok/s at `to_concurrency` over `from_concurrency` (interpolated on the knee's setting; a
    target past the last point is taken at the last point), the accept lengths at both, and the concurrency the
    target was taken at."""
    curve = report.curve()
    if not curve:
        raise LookupError("the sweep measured nothing")
    reached = min(to_concurrency, curve[-1].concurrency)
    before, accept_before = report.throughput_at(from_concurrency)
    after, accept_after = report.throughput_at(reached)
    if not before:
        raise LookupError(f"no throughput measured at {from_concurrency}")
    return after / before, accept_before, accept_after, reached
