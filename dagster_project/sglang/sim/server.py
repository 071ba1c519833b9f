"""An SGLang 0.5.23 stand-in: one HTTP server process that answers like the real one.

It serves native `/generate` with `input_ids` and the ops routes, errors included, without a GPU.
This module is the HTTP server: routes, responses, streaming, admin routes and the command line. The
rest lives in:

* `sim.config` — `SimConfig` (one field per flag; the pools sized from memory by `sglang.capacity`) and
  `SimVocab`, the tokenizer facts a server needs.
* `sim.requests` — the `/generate` request checks in the server's order and their error shapes (E1-E4).
* `sim.outputs` — the answer to a prompt: real Qwen3.6 token ids with a think block, the exact `text`,
  the finish reason and spec-decoding stats; a deterministic function of `--seed` and the prompt.
* `sim.scheduler` — running cap, KV-budget admission and retraction, FIFO queue (503 when bounded and
  full), latency model (decode steps slow with the batch), aborts.
* `sim.faults` — injected failures: crash, drop, hang (or `/generate` alone hung behind a `/health` that
  answers), slow, answers that trickle in, 503 bursts, empty/truncated/NaN answers, a bad
  model's "OK." answers (from the start or after N answers), garbage bodies, MTP off.
* `sim.ops` — the bodies of /server_info, /model_info, /v1/models and /metrics, and their counters.
* `sim.command_line` — the flags (SGLang's that it models, and its own) and `--config FILE`, into a `SimConfig`.

Streaming (`"stream": true`) sends cumulative chunks after prefill and at each quarter of the decode,
the finished response, then `data: [DONE]`. Admin routes under `/_sim/` (never SGLang's) set
faults, read the request log (`rid`, prompt hash, outcome), the abort log (each `/abort_request`'s rid, when,
how many requests it ended) and the scheduler state.

Start one with `python -m dagster_project.sglang.sim.server --port 31000 [options]`; fleets are started by
`dagster_project.sglang.launch.launch_simulators`.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.sim import ops as sim_ops
from dagster_project.sglang.sim.command_line import parse_args
from dagster_project.sglang.sim.config import SimConfig, SimVocab, load_sim_vocab
from dagster_project.sglang.sim.faults import Faults, crash, drop_connection
from dagster_project.sglang.sim.outputs import OutputModel, correct_drafts
from dagster_project.sglang.sim.prefix_cache import PrefixCache
from dagster_project.sglang.sim.requests import (
    GenerateItem,
    RequestError,
    check_request,
    parse_generate,
    queue_full,
    read_json,
)
from dagster_project.sglang.sim.scheduler import Job, QueueFull, Scheduler

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_PROXY_ERROR_PAGE = "<html><head><title>502 Bad Gateway</title></head><body>upstream error</body></html>"
_HEALTH_POLL_S = 0.1  # how often a health check looks for progress (the real server: once a second)
_TRICKLE_TICK_S = 0.1  # a trickling answer's body goes out in pieces this far apart (or one byte each, when slower)

# A request log entry is a list (a million of them must stay small); its outcome changes as it runs.
_LOG_KEYS = ("rid", "input_hash", "prompt_tokens", "received_at", "outcome")
_OUTCOME = _LOG_KEYS.index("outcome")


class Simulator:
    def __init__(self, config: SimConfig, vocab: SimVocab):
        self.config = config
        self.vocab = vocab
        self.model = OutputModel(config, vocab)
        self.loop = asyncio.get_running_loop()
        self.faults = Faults()
        self._fault_draws = random.Random(config.seed)  # which answers the share faults alter
        self.faults.update(config.faults, time.perf_counter())
        self.started_at = time.perf_counter()
        self.started_wall = time.time()
        self.scheduler = Scheduler(config, self.faults, self.started_at)
        self.stats = sim_ops.Stats()
        self.metrics_collector = sim_ops.SimMetrics(config, self.scheduler, self.stats)
        self.request_log: list[list] = []
        self.abort_log: list[dict] = []  # every /abort_request: its rid, when (epoch s), how many requests it ended
        # The radix cache, as SGLang keeps it unless launched with --disable-radix-cache.
        self.prefix_cache = None if config.disable_radix_cache else PrefixCache()
        self._tokenizer: Any = None
        self.faults.arm_crash_timer(self.loop)

    # ---- /generate ----

    async def generate(self, request: web.Request) -> web.StreamResponse:
        received = time.perf_counter()
        try:
            body = await read_json(request)
            batch = parse_generate(body)
        except RequestError as error:
            return _json(error.body, error.status)
        self.faults.count_arrival()
        if self.faults.take("garbage"):
            return web.Response(text=_PROXY_ERROR_PAGE, content_type="text/html")
        if body.get("stream"):
            if len(batch) > 1 or int(batch[0].params.get("n") or 1) > 1:
                return _json(proto.e3_body("the simulator streams single requests only (no batch, n=1)"), 400)
            return await self._stream(request, batch[0], received)
        if len(batch) > 1:
            results = await asyncio.gather(
                *(self._generate_one(request, item, received) for item in batch), return_exceptions=True
            )
            for result in results:
                if isinstance(result, RequestError):
                    return _json(result.body, result.status)
                if isinstance(result, BaseException):
                    raise result
            return await self._answer(request, results)
        try:
            answer = await self._generate_one(request, batch[0], received)
        except RequestError as error:
            return _json(error.body, error.status)
        return await self._answer(request, answer)

    async def _answer(self, request: web.Request, body: Any) -> web.StreamResponse:
        """A finished answer: at once, or at the `trickle_bytes_per_s` fault's rate after its status and headers."""
        rate = self.faults.trickle_bytes_per_s
        if not rate:
            return _json(body, 200)
        data = orjson.dumps(body)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(data)
        await response.prepare(request)
        step = max(1, round(rate * _TRICKLE_TICK_S))
        try:
            for start in range(0, len(data), step):
                await response.write(data[start : start + step])  # the first piece carries the headers
                await asyncio.sleep(step / rate)
            await response.write_eof()
        except ConnectionResetError:  # the client gave up on it
            pass
        return response

    async def _prepare(self, item: GenerateItem, received: float) -> tuple[list[int], list, list[Job], int]:
        """Stage C checks, then one planned job per sample, and the prompt's tokens found in the prefix cache;
        every request is logged, refused or not."""
        params = item.params
        input_ids = item.prompt if isinstance(item.prompt, list) else await self._tokenize(item.prompt)
        prompt_hash = proto.input_hash(input_ids)
        log = [item.rid, prompt_hash, len(input_ids), time.time(), "pending"]
        if len(self.request_log) < self.config.request_log_limit:
            self.request_log.append(log)
        try:
            max_new_tokens = check_request(input_ids, params, item.rid, self.config, self.scheduler.jobs)
            if self.faults.rejects_with_503(time.perf_counter()):
                raise queue_full()
        except RequestError as error:
            log[_OUTCOME] = f"error:{error.status}"
            raise
        if max(input_ids) >= self.config.vocab_size:
            # 0.5.23 checks no id against the vocabulary: the scheduler's embedding raises IndexError and the whole
            # server dies, every connection dropped without a status.
            crash(f"IndexError: input id {max(input_ids)} outside the embedding of {self.config.vocab_size} rows")
        samples = int(params.get("n") or 1)
        rids = [item.rid] if samples == 1 else [uuid.uuid4().hex for _ in range(samples)]  # n>1: fresh rids
        jobs = []
        for sample, rid in enumerate(rids):
            answer = self.model.plan(
                input_ids,
                prompt_hash,
                params,
                max_new_tokens,
                sample,
                batch=self.scheduler.expected_batch(),
                empty=self.faults.take("empty"),
                truncate=self.faults.take("truncate"),
                mtp_off=self.faults.mtp_off,
                nan=self.faults.take("nan"),
                bad=self.faults.bad_answer(self.model.bad_draw(prompt_hash, sample)),
            )
            jobs.append(self.scheduler.add(rid, answer, len(input_ids), max_new_tokens, received))
        cached = self.prefix_cache.match(input_ids) if self.prefix_cache is not None else 0
        return input_ids, log, jobs, cached

    async def _execute(
        self, jobs: list[Job], log: list, checkpoint: Callable[[Job], Awaitable[None]] | None = None
    ) -> None:
        try:
            await asyncio.gather(*(self.scheduler.run(job, checkpoint) for job in jobs))
        except QueueFull:
            log[_OUTCOME] = "error:503"
            raise queue_full() from None
        except asyncio.CancelledError:  # the client went away: the server aborts the request
            log[_OUTCOME] = "disconnected"
            for job in jobs:
                job.aborted = True
            self.stats.counters["aborted"] += len(jobs)
            raise
        finally:
            self.scheduler.forget(jobs)

    async def _generate_one(self, request: web.Request, item: GenerateItem, received: float) -> Any:
        input_ids, log, jobs, cached = await self._prepare(item, received)
        drop = self.faults.take("drop")
        await self._execute(jobs, log)
        if drop:
            log[_OUTCOME] = "dropped"
            drop_connection(request)
        responses = [self._respond(job, input_ids, item, cached) for job in jobs]
        log[_OUTCOME] = responses[0]["meta_info"]["finish_reason"]["type"]
        return responses[0] if len(jobs) == 1 else responses

    async def _stream(self, request: web.Request, item: GenerateItem, received: float) -> web.StreamResponse:
        """Server-sent events: cumulative output, `finish_reason` null until the last chunk, then [DONE].

        Chunks come after prefill and at each quarter of the decode, not after every token.
        """
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def send(body: dict) -> None:
            await response.write(b"data: " + orjson.dumps(body) + b"\n\n")

        try:
            input_ids, log, (job,), cached = await self._prepare(item, received)
        except RequestError as error:
            # Headers are out: a scheduler abort arrives as a normal chunk, a refusal as an error chunk.
            if error.status == 503:
                finish = proto.finish_abort(error.body["message"], 503)
                await send({"text": "", "output_ids": [], "meta_info": {"id": item.rid, "finish_reason": finish}})
            else:
                message = error.body["error"]["message"]
                details = {
                    "message": message,
                    "type": "invalid_request_error",
                    "code": error.status,
                    "retryable": False,
                }
                await send({"error": details})
            await response.write(b"data: [DONE]\n\n")
            return response
        drop = self.faults.take("drop")
        first = True

        async def checkpoint(job: Job) -> None:
            nonlocal first
            ids = job.partial()[0]
            meta = {
                "id": job.rid,
                "finish_reason": None,
                "prompt_tokens": job.prompt_tokens,
                "weight_version": "default",
                "num_retractions": job.retractions,
                "reasoning_tokens": self._reasoning_tokens(ids, item),
                "completion_tokens": len(ids),
                "cached_tokens": cached,
                "cached_tokens_details": _cached_details(cached),
                "dp_rank": None,
            }
            if first:
                meta["response_sent_to_client_ts"] = time.time()
                first = False
            await send({"text": self.vocab.decode(ids), "output_ids": ids, "meta_info": meta})
            if drop:
                log[_OUTCOME] = "dropped"
                drop_connection(request)  # mid-stream: the client sees no [DONE]

        await self._execute([job], log, checkpoint)
        final = self._respond(job, input_ids, item, cached)
        del final["meta_info"]["response_sent_to_client_ts"]  # only the first chunk carries it
        log[_OUTCOME] = final["meta_info"]["finish_reason"]["type"]
        await send(final)
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _tokenize(self, text: str) -> list[int]:
        if self._tokenizer is None:  # loaded on first use: most clients send input_ids
            from dagster_project.tokenizer import load_tokenizer

            # The sketch's tokenizer: a fleet's servers get the sketch (--vocab-file), not --tokenizer.
            self._tokenizer = await asyncio.to_thread(load_tokenizer, self.vocab.tokenizer)
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _respond(self, job: Job, input_ids: list[int], item: GenerateItem, cached: int) -> dict:
        """The finished response, meta_info keys in the server's order; records the request's stats."""
        answer, params = job.answer, item.params
        finished_at = time.perf_counter()
        if job.aborted:
            ids, spec_ct, histogram = job.partial()
            text = self.vocab.decode(ids)
            finish = proto.finish_abort()
            self.stats.counters["aborted"] += 1
        else:
            ids, text, finish = answer.output_ids, answer.text, answer.finish_reason
            if self.prefix_cache is not None:
                self.prefix_cache.insert(input_ids, ids)
            spec_ct = answer.spec.verify if answer.spec is not None else 0
            histogram = answer.spec.histogram if answer.spec is not None else []
            if params.get("no_stop_trim") and finish["type"] == "stop":
                matched = finish["matched"]
                skip = params.get("skip_special_tokens", True) is not False and matched in self.vocab.special_ids
                text += "" if skip else answer.stop_text
        completion = len(ids)
        wall = self.started_wall - self.started_at  # perf_counter → epoch seconds
        started = job.started or finished_at  # never admitted (aborted while queued): no queueing time
        queue_s = started - job.received
        e2e = finished_at - job.received
        meta: dict[str, Any] = {
            "id": job.rid,
            "finish_reason": finish,
            "prompt_tokens": job.prompt_tokens,
            "weight_version": "default",
            "num_retractions": job.retractions,
        }
        if self.config.enable_metrics:
            meta["storage_prefetch_wait"] = 0.0  # no hierarchical cache to wait on
            meta["storage_staging_wait"] = 0.0
            meta["forward_entry_time"] = wall + started
            meta["prefill_finished_time"] = wall + started + job.prefill_s
            meta["queue_time"] = queue_s
        meta["reasoning_tokens"] = self._reasoning_tokens(ids, item)
        meta["completion_tokens"] = completion
        meta["cached_tokens"] = cached
        meta["weight_versions"] = [{"version": "default", "start": 0, "end": completion}]
        meta["cached_tokens_details"] = _cached_details(cached)
        meta["dp_rank"] = None
        meta["e2e_latency"] = e2e
        if spec_ct > 0:
            correct = correct_drafts(histogram)
            proposed = spec_ct * (self.config.spec_draft_tokens - 1)
            meta["spec_accept_rate"] = correct / proposed
            meta["spec_accept_length"] = completion / spec_ct
            meta["spec_num_correct_drafts"] = correct
            meta["spec_num_proposed_drafts"] = proposed
            meta["spec_verify_ct"] = spec_ct
            if histogram:
                meta["spec_correct_drafts_histogram"] = histogram
            self.stats.record_spec(completion, spec_ct, correct)
        if self.config.enable_metrics:
            decode_s = e2e - queue_s - job.prefill_s
            meta["request_received_ts"] = wall + job.received
            meta["first_token_latency"] = queue_s + job.prefill_s
            meta["api_server_dispatch_finish_ts"] = wall + job.received
            meta["request_finished_ts"] = wall + finished_at
            meta["decode_throughput"] = completion / decode_s if decode_s > 0 else 0.0
        meta["response_sent_to_client_ts"] = time.time()
        response: dict[str, Any] = {"text": text, "output_ids": ids, "meta_info": meta}
        if not job.aborted:
            budget = params.get("max_new_tokens") or len(ids)
            self.faults.break_contract(response, budget, self.vocab.eos_ids[0], self._fault_draws.random)
        if item.return_prompt_token_ids:
            response["prompt_token_ids"] = input_ids
        self.stats.record_finish(job.prompt_tokens, completion, e2e)
        return response

    def _reasoning_tokens(self, ids: list[int], item: GenerateItem) -> int:
        """Counted only on request (`require_reasoning`) with a reasoning parser: up to and including </think>."""
        if not (item.require_reasoning and self.config.reasoning_parser):
            return 0
        try:
            return ids.index(self.vocab.think_end) + 1
        except ValueError:
            return len(ids)

    # ---- ops routes ----

    def _starting(self) -> bool:
        return time.perf_counter() - self.started_at < self.config.startup_s

    async def health(self, request: web.Request) -> web.Response:
        """`/health` and `/health_generate` share SGLang's handler: a 1-token generation must make progress.

        The real server injects a one-token request and polls for output once a second; with no output within
        its health-check timeout (20 s by default) it answers 503. Here a hung scheduler makes no progress.
        """
        if self._starting():
            return web.Response(status=503)
        if self.config.health_latency_s:
            await asyncio.sleep(self.config.health_latency_s)
        deadline = time.perf_counter() + self.config.health_check_timeout_s
        while self.faults.hang:
            if time.perf_counter() >= deadline:
                return web.Response(status=503)
            await asyncio.sleep(min(_HEALTH_POLL_S, max(0.0, deadline - time.perf_counter())))
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self._starting() else 200)

    async def model_info(self, request: web.Request) -> web.Response:
        return _json(sim_ops.model_info(self.config))

    async def models(self, request: web.Request) -> web.Response:
        return _json(sim_ops.models(self.config, self.started_wall))

    async def server_info(self, request: web.Request) -> web.Response:
        return _json(sim_ops.server_info(self.config, self.scheduler, self.stats))

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.scheduler.jobs:
            return web.Response(status=400, text=proto.MSG_FLUSH_FAILED)
        self.stats.flush()
        return web.Response(text=proto.MSG_FLUSH_OK)

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
        except RequestError as error:
            return _json(error.body, error.status)
        rid, abort_all = body.get("rid") or "", bool(body.get("abort_all"))
        ended = self.scheduler.abort(rid, abort_all)
        if len(self.abort_log) < self.config.request_log_limit:
            self.abort_log.append({"rid": rid, "abort_all": abort_all, "at": time.time(), "ended": ended})
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.config.enable_metrics:
            return web.Response(status=404, text="Not Found")
        text = self.metrics_collector.exposition()
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    # ---- /_sim admin routes ----

    async def sim_faults(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            self.faults.clear()
        elif request.method == "POST":
            try:
                self.faults.update(await read_json(request), time.perf_counter())
            except (ValueError, TypeError) as exc:
                return _json({"error": str(exc)}, 400)
            except RequestError as error:
                return _json(error.body, error.status)
        if request.method != "GET":  # reading the faults must not restart a crash countdown
            self.faults.arm_crash_timer(self.loop)
            self.scheduler.wake_all()  # hang / slow changes apply to requests already running
        return _json(self.faults.as_dict())

    async def sim_requests(self, request: web.Request) -> web.Response:
        since = int(request.query.get("since", 0))
        entries = [dict(zip(_LOG_KEYS, entry)) for entry in self.request_log[since:]]
        return _json({"total": len(self.request_log), "requests": entries})

    async def sim_aborts(self, request: web.Request) -> web.Response:
        return _json({"aborts": self.abort_log})

    async def sim_state(self, request: web.Request) -> web.Response:
        now = time.perf_counter()
        scheduler = self.scheduler
        if request.method == "POST" and request.query.get("reset_occupancy"):
            scheduler.reset_occupancy(now)
        return _json(
            {
                "pid": os.getpid(),
                "running": scheduler.running,
                "queued": len(scheduler.waiting),
                "cap": scheduler.cap,
                "uptime_s": now - self.started_at,
                "counters": self.stats.counters,
                "peaks": scheduler.peaks,
                "faults": self.faults.as_dict(),
                "occupancy": scheduler.occupancy.report(now),
            }
        )

    def _keyed(self, handler: Handler) -> Handler:
        """With --api-key, SGLang wants the key on every route but /health*, /ready and /metrics."""
        key = self.config.api_key
        if not key:
            return handler
        expected = f"Bearer {key}"

        async def guarded(request: web.Request) -> web.StreamResponse:
            if request.headers.get("Authorization") != expected:
                return _json(proto.UNAUTHORIZED_BODY, 401)
            return await handler(request)

        return guarded

    def app(self) -> web.Application:
        app = web.Application(client_max_size=512 * 1024 * 1024)
        router, keyed = app.router, self._keyed
        generate = keyed(self.generate)
        router.add_route("POST", "/generate", generate)
        router.add_route("PUT", "/generate", generate)
        for path in ("/health", "/health_generate"):
            router.add_get(path, self.health)
        router.add_get("/ready", self.ready)
        for path in ("/model_info", "/get_model_info"):
            router.add_get(path, keyed(self.model_info))
        for path in ("/server_info", "/get_server_info"):
            router.add_get(path, keyed(self.server_info))
        router.add_get("/v1/models", keyed(self.models))
        flush_cache = keyed(self.flush_cache)
        router.add_route("GET", "/flush_cache", flush_cache)
        router.add_route("POST", "/flush_cache", flush_cache)
        router.add_post("/abort_request", keyed(self.abort_request))
        router.add_get("/metrics", self.metrics)
        for method in ("GET", "POST", "DELETE"):
            router.add_route(method, "/_sim/faults", self.sim_faults)
        router.add_get("/_sim/requests", self.sim_requests)
        router.add_get("/_sim/aborts", self.sim_aborts)
        router.add_route("GET", "/_sim/state", self.sim_state)
        router.add_route("POST", "/_sim/state", self.sim_state)
        return app


def _cached_details(cached: int) -> dict | None:
    """Where the cached prefix was found: on the device (no hierarchical cache here); null when nothing was."""
    return {"device": cached, "host": 0} if cached else None


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def serve(config: SimConfig, vocab: SimVocab) -> None:
    simulator = Simulator(config, vocab)
    # handler_cancellation: a client that disconnects cancels its handler, as SGLang aborts its rid.
    runner = web.AppRunner(simulator.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=4096, reuse_address=True)
    await site.start()
    if simulator.model.calls_note:
        print(simulator.model.calls_note, flush=True)
    print(f"simulator ready on http://{config.host}:{config.port} (pid {os.getpid()})", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    vocab = (
        SimVocab.from_json(Path(config.vocab_file).read_bytes())
        if config.vocab_file
        else load_sim_vocab(config.tokenizer)
    )
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config, vocab))
    else:
        uvloop.run(serve(config, vocab))


if __name__ == "__main__":
    main()
