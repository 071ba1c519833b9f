"""SGLangClient against simulator processes: results, every error kind, and API-key hygiene."""

from __future__ import annotations

import asyncio

import pytest

from dagster_project.sglang import client as sgl
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.launch import free_ports
from tests.support.sglang_fixtures import wait_until

PROMPT = [248045, 846, 198, 9419, 248046, 198, 248045, 74455, 198, 248068, 198]
PARAMS = proto.sampling_params(max_new_tokens=2048)
SECRET = "sk-client-test-0123456789"


def run(coroutine):
    return asyncio.run(coroutine)


async def call(url: str, method: str, *args, api_key: str | None = None, **kwargs):
    async with sgl.SGLangClient(url, api_key=api_key) as client:
        return await getattr(client, method)(*args, **kwargs)


async def expect_error(url: str, method: str, *args, **kwargs) -> sgl.SGLangError:
    with pytest.raises(sgl.SGLangError) as caught:
        await call(url, method, *args, **kwargs)
    return caught.value


def test_generate_returns_the_answer_with_spec_stats(sim_fleet):
    url = sim_fleet(1).url(0)
    result = run(call(url, "generate", PROMPT, PARAMS))
    assert len(result.rid) == 32 and int(result.rid, 16) >= 0  # uuid4 hex
    assert (
        result.finish_reason == {"type": "stop", "matched": 248046}
        and result.finish_type == "stop"
        and not result.truncated
    )
    assert result.completion_tokens == len(result.output_ids) and result.prompt_tokens == len(PROMPT)
    assert result.meta_info["reasoning_tokens"] > 0  # require_reasoning is sent
    assert result.spec_accept_length == result.completion_tokens / result.spec_verify_ct
    assert sum(result.spec_histogram) == result.spec_verify_ct
    assert result.spec_num_proposed_drafts == 3 * result.spec_verify_ct and 0 <= result.spec_accept_rate <= 1
    assert run(call(url, "generate", PROMPT, PARAMS, rid="fixed-rid")).rid == "fixed-rid"
    assert run(call(url, "generate", PROMPT, proto.sampling_params(max_new_tokens=3))).truncated


def test_ops_calls(sim_fleet):
    fleet = sim_fleet(1, enable_metrics=True)
    url = fleet.url(0)
    assert run(call(url, "health")) and run(call(url, "health_generate"))
    info = run(call(url, "server_info"))
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 8
    assert run(call(url, "model_info"))["model_path"] == "Qwen/Qwen3.6-27B"
    assert "sglang:num_running_reqs" in run(call(url, "metrics"))
    assert run(call(url, "flush_cache")) is True
    run(call(url, "abort", "no-such-rid"))
    assert not run(call(f"http://127.0.0.1:{free_ports(1)[0]}", "health"))


def test_request_errors_are_typed_and_not_retryable(sim_fleet):
    url = sim_fleet(1, context_length=1000).url(0)
    error = run(expect_error(url, "generate", PROMPT, proto.sampling_params(max_new_tokens=5000)))
    assert (error.kind, error.retryable, error.status) == ("context_length", False, 400)
    # The input counts the 4 tokens NEXTN 3/1/4 reserves for its drafts.
    assert error.message == proto.msg_total_too_long(1000, len(PROMPT) + 4, 5000)
    error = run(expect_error(url, "generate", PROMPT, {"max_new_tokens": 1.0}))
    assert (error.kind, error.retryable) == ("bad_request", False) and "expected i64" in error.message
    assert run(expect_error(url, "metrics")).kind == "not_found"  # metrics disabled


def test_server_failures_are_typed_and_retryable(sim_fleet):
    fleet = sim_fleet(1, decode_step_s=0.01, output_len="fixed:300")
    url = fleet.url(0)
    fleet.set_faults(0, error_503=1)
    error = run(expect_error(url, "generate", PROMPT, PARAMS))
    assert (error.kind, error.retryable, error.status, error.message) == (
        "queue_full",
        True,
        503,
        "The request queue is full.",
    )
    fleet.set_faults(0, drop=1)
    assert run(expect_error(url, "generate", PROMPT, PARAMS)).kind == "connection_dropped"
    fleet.set_faults(0, hang_generate=True)  # no answer ever comes: the client's own timeout ends the call
    error = run(expect_error(url, "generate", PROMPT, PARAMS, timeout=0.2))
    assert (error.kind, error.retryable) == ("timeout", True)
    fleet.clear_faults(0)

    async def aborted() -> sgl.SGLangError:
        task = asyncio.create_task(expect_error(url, "generate", PROMPT, PARAMS, rid="to-abort"))
        await asyncio.to_thread(wait_until, lambda: fleet.state(0)["running"] >= 1, what="a running request")
        await call(url, "abort", "to-abort")
        return await task

    error = run(aborted())
    assert (error.kind, error.retryable) == ("aborted", True) and error.partial is not None
    fleet.kill(0)
    error = run(expect_error(url, "generate", PROMPT, PARAMS))
    assert (error.kind, error.retryable, error.status) == ("server_unavailable", True, None), str(error)


def test_crash_mid_request_is_a_dropped_connection(sim_fleet):
    fleet = sim_fleet(1, decode_step_s=0.01, output_len="fixed:300")

    async def crash() -> sgl.SGLangError:
        task = asyncio.create_task(expect_error(fleet.url(0), "generate", PROMPT, PARAMS))
        await asyncio.to_thread(wait_until, lambda: fleet.state(0)["running"] == 1, what="a running request")
        await asyncio.to_thread(fleet.set_faults, 0, crash_after_s=0)
        return await task

    assert run(crash()).kind == "connection_dropped"


def test_the_api_key_is_sent_and_never_shown(sim_fleet):
    url = sim_fleet(1, api_key=SECRET).url(0)
    assert run(call(url, "generate", PROMPT, PARAMS, api_key=SECRET)).completion_tokens > 0
    info = run(call(url, "server_info", api_key=SECRET))
    assert info["api_key"] == "<redacted>" and SECRET not in repr(info)
    error = run(expect_error(url, "generate", PROMPT, PARAMS, api_key=SECRET + "-wrong"))
    assert (error.kind, error.retryable, error.status) == ("unauthorized", False, 401)
    client = sgl.SGLangClient(url, api_key=SECRET)
    assert SECRET not in repr(client) and SECRET not in str(error) + repr(error)


def test_a_nan_stop_is_a_retryable_error_not_an_answer(sim_fleet):
    fleet = sim_fleet(1)
    fleet.set_faults(0, nan=1)
    error = run(expect_error(fleet.url(0), "generate", PROMPT, PARAMS))
    assert error.kind == sgl.SAMPLING_FAILED and error.retryable and "NaN happened" in error.message
    assert error.url == fleet.url(0)


def test_ops_bodies_that_are_not_json_are_typed_errors_naming_the_server():
    from aiohttp import web

    async def scenario() -> list[sgl.SGLangError]:
        async def proxy_error_page(request: web.Request) -> web.Response:
            return web.Response(text="<html><body>502 Bad Gateway</body></html>", content_type="text/html")

        app = web.Application()
        for path in ("/server_info", "/model_info"):
            app.router.add_get(path, proxy_error_page)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_ports(1)[0]
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        try:
            return [await expect_error(url, "server_info"), await expect_error(url, "model_info")]
        finally:
            await runner.cleanup()

    for error, path in zip(run(scenario()), ("/server_info", "/model_info")):
        assert error.kind == sgl.BAD_RESPONSE and error.url and error.url in str(error)
        assert f"{path} is not a JSON object" in error.message and "502 Bad Gateway" in error.message
