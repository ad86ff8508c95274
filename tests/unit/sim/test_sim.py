"""The simulator over real loopback sockets: endpoints, every fault, stats, aborts, ports."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llm_health.cli.sim import register, settings_from_args
from llm_health.sim.faults import FAULTS, FaultSpec
from llm_health.sim.metrics import render_metrics
from llm_health.sim.server import (
    STATE_KEY,
    SimHandle,
    SimSettings,
    build_app,
    running_sim,
    serve,
)
from llm_health.sim.state import SimState
from tests.polling import wait_until_async
from tests.ports import free_port

HANG_TIMEOUT = aiohttp.ClientTimeout(total=0.4)
PROBE_HEADERS = {"X-LLM-Probe": "true"}
FAST = FaultSpec(ttft=0.0, tpot=0.0)


# ---------------------------------------------------------------- helpers


pytestmark = pytest.mark.sim_settings(fault=FaultSpec(ttft=0.01, tpot=0.005))


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": "hi", "max_tokens": 3, "stream": True, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": "sim-model", "messages": messages, "max_tokens": 3, "stream": True, **extra}


async def set_fault(session: aiohttp.ClientSession, sim: SimHandle, **spec: Any) -> dict[str, Any]:
    async with session.post(f"{sim.base_url}/sim/fault", json=spec) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def read_events(resp: aiohttp.ClientResponse) -> list[str]:
    """Every SSE ``data:`` payload of a response, read to the end."""
    events = []
    async for raw in resp.content:
        line = raw.decode(errors="replace").strip()
        if line.startswith("data: "):
            events.append(line[len("data: ") :])
    return events


def token_of(event: str) -> str | None:
    """The generated text an event carries, or None (role delta, error, [DONE])."""
    if event == "[DONE]":
        return None
    choices = json.loads(event).get("choices") or [{}]
    choice = choices[0]
    text = choice.get("text", choice.get("delta", {}).get("content"))
    return text or None


def invariant_holds(state: SimState) -> bool:
    c = state.counters
    return c.requests == c.completed + c.failed + c.aborted + state.in_flight


# ---------------------------------------------------------------- FaultSpec


def test_fault_spec_json_round_trip_and_merge() -> None:
    spec = FaultSpec.from_json({"fault": "overloaded", "ttft": "100ms", "overload_status": 503})
    assert (spec.fault, spec.ttft, spec.overload_status) == ("overloaded", 0.1, 503)
    assert FaultSpec.from_json(spec.to_json()) == spec
    merged = FaultSpec.from_json({"fault": "none"}, base=spec)
    assert (merged.fault, merged.ttft, merged.overload_status) == ("none", 0.1, 503)
    assert FaultSpec.from_json({}) == FaultSpec()
    assert set(FaultSpec().to_json()) >= {"fault", "ttft", "ttft_jitter", "tpot", "fault_rate"}


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"fault": "explode"}, '"fault"'),
        ({"fault": 3}, '"fault"'),
        ({"ttft": "80x"}, '"ttft"'),
        ({"ttft": 100}, '"ttft"'),
        ({"tpot": None}, '"tpot"'),
        ({"fault_rate": 1.5}, '"fault_rate"'),
        ({"fault_rate": True}, '"fault_rate"'),
        ({"overload_status": 500}, '"overload_status"'),
        ({"hang_max": "0s"}, '"hang_max"'),
        ({"colour": "red"}, "'colour'"),
        (["none"], "JSON object"),
    ],
)
def test_fault_spec_rejects_bad_input_naming_the_key(data: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        FaultSpec.from_json(data)


def test_ttft_jitter_stays_in_range() -> None:
    spec = FaultSpec(ttft=0.1, ttft_jitter=0.05)
    samples = [spec.draw_ttft(random.Random(seed)) for seed in range(200)]
    assert all(0.05 <= s <= 0.15 for s in samples)
    assert max(samples) - min(samples) > 0.05
    assert FaultSpec(ttft=0.01, ttft_jitter=0.5).draw_ttft(random.Random(1)) >= 0.0


# ---------------------------------------------------------------- normal service


async def test_streamed_completion_has_vllm_shape(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    async with session.post(f"{sim.base_url}/v1/completions", json=completion()) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await read_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == [" Paris", " is", " a"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    first = chunks[0]
    assert first["object"] == "text_completion"
    assert first["model"] == "sim-model"
    assert {"id", "created"} <= set(first)
    assert first["choices"][0]["index"] == 0 and first["choices"][0]["logprobs"] is None
    assert sim.state.counters.completed == 1


async def test_chat_role_chunk_is_flushed_before_the_ttft_wait(
    session: aiohttp.ClientSession,
) -> None:
    async with running_sim(SimSettings(fault=FaultSpec(ttft=0.3, tpot=0.001))) as sim:
        started = time.monotonic()
        arrivals: list[tuple[float, str]] = []
        body = chat(stream_options={"include_usage": True})
        async with session.post(f"{sim.base_url}/v1/chat/completions", json=body) as resp:
            async for raw in resp.content:
                if raw.startswith(b"data: "):
                    arrivals.append((time.monotonic() - started, raw[6:].decode().strip()))
    role_at, role = arrivals[0]
    assert json.loads(role)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert json.loads(role)["object"] == "chat.completion.chunk"
    assert role_at < 0.2
    first_token_at, first_token = arrivals[1]
    assert first_token_at >= 0.29
    assert json.loads(first_token)["choices"][0]["delta"] == {"content": " Paris"}
    assert json.loads(arrivals[3][1])["choices"][0]["finish_reason"] == "length"
    assert json.loads(arrivals[4][1])["usage"]["completion_tokens"] == 3
    assert arrivals[-1][1] == "[DONE]"


async def test_non_streamed_responses_honour_max_tokens(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    body = completion(stream=False, max_tokens=4, temperature=0, top_p=1, cache_salt="s")
    async with session.post(f"{sim.base_url}/v1/completions", json=body) as resp:
        assert resp.status == 200
        doc = await resp.json()
    assert doc["object"] == "text_completion"
    assert doc["choices"][0]["text"] == " Paris is a city"
    assert doc["choices"][0]["finish_reason"] == "length"
    assert doc["usage"]["completion_tokens"] == 4
    default = {"messages": [{"role": "user", "content": "hi"}]}
    async with session.post(f"{sim.base_url}/v1/chat/completions", json=default) as resp:
        doc = await resp.json()
    assert doc["object"] == "chat.completion"
    assert doc["choices"][0]["message"]["role"] == "assistant"
    assert doc["choices"][0]["message"]["content"] == " Paris is a city" * 4  # 16 tokens


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/v1/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/completions", b"[1, 2]", 400, "JSON object"),
        ("/v1/completions", b'{"max_tokens": 2}', 400, '"prompt"'),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}', 400, '"max_tokens"'),
        ("/v1/completions", b'{"prompt": "hi", "stream": "yes"}', 400, '"stream"'),
        ("/v1/chat/completions", b'{"messages": "hi"}', 400, '"messages"'),
        ("/v1/completions", b'{"prompt": "hi", "model": "other"}', 404, "does not exist"),
    ],
)
async def test_bad_inference_requests_get_openai_errors(
    sim: SimHandle,
    session: aiohttp.ClientSession,
    path: str,
    body: bytes,
    status: int,
    fragment: str,
) -> None:
    async with session.post(sim.base_url + path, data=body) as resp:
        assert resp.status == status
        error = (await resp.json())["error"]
    assert fragment in error["message"]
    assert error["code"] == status
    assert error["type"] == ("BadRequestError" if status == 400 else "NotFoundError")
    assert sim.state.counters.bad_requests == 1
    assert sim.state.counters.requests == 0


async def test_models_health_and_api_key(session: aiohttp.ClientSession) -> None:
    async with running_sim(SimSettings(model="m/x", api_key="k", fault=FAST)) as sim:
        async with session.get(f"{sim.base_url}/v1/models") as resp:
            models = await resp.json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["m/x"]
        url = f"{sim.base_url}/v1/completions"
        async with session.post(url, json=completion(model="m/x")) as resp:
            assert resp.status == 401
        headers = {"Authorization": "Bearer k"}
        async with session.post(url, json=completion(model="m/x"), headers=headers) as resp:
            assert resp.status == 200
            await resp.read()
        async with session.get(f"{sim.base_url}/health") as resp:
            assert resp.status == 200
        assert sim.state.counters.unauthorized == 1
        assert sim.state.last_request is not None
        assert sim.state.last_request["authorization"] is True


# ---------------------------------------------------------------- hangs


@pytest.mark.parametrize("fault", ["hang_before_headers", "hang_after_headers"])
async def test_hangs_keep_health_green_and_release_on_disconnect(
    sim: SimHandle, session: aiohttp.ClientSession, fault: str
) -> None:
    await set_fault(session, sim, fault=fault)
    url = f"{sim.base_url}/v1/completions"

    async def hung_request() -> None:
        async with session.post(url, json=completion(), timeout=HANG_TIMEOUT) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            await resp.content.readany()

    task = asyncio.create_task(hung_request())
    await wait_until_async(lambda: sim.state.in_flight == 1, 5, "sim.state.in_flight == 1")
    async with session.get(f"{sim.base_url}/health") as resp:
        assert resp.status == 200
    async with session.get(f"{sim.base_url}/metrics") as resp:
        text = await resp.text()
        # vLLM's meaning: the hung request is scheduled (running), not queued.
        assert 'vllm:num_requests_running{model_name="sim-model"} 1.0' in text
        assert 'vllm:num_requests_waiting{model_name="sim-model"} 0.0' in text
    with pytest.raises(asyncio.TimeoutError):
        await task
    await wait_until_async(
        lambda: sim.state.counters.aborted == 1, 5, "sim.state.counters.aborted == 1"
    )
    assert sim.state.in_flight == 0
    assert invariant_holds(sim.state)


async def test_hang_after_role_chunk(sim: SimHandle, session: aiohttp.ClientSession) -> None:
    await set_fault(session, sim, fault="hang_after_role_chunk")
    seen: list[bytes] = []

    async def hung_chat() -> None:
        url = f"{sim.base_url}/v1/chat/completions"
        async with session.post(url, json=chat(), timeout=HANG_TIMEOUT) as resp:
            async for raw in resp.content:
                seen.append(raw)

    with pytest.raises(asyncio.TimeoutError):
        await hung_chat()
    events = [json.loads(raw[6:]) for raw in seen if raw.startswith(b"data: ")]
    assert [e["choices"][0]["delta"] for e in events] == [{"role": "assistant", "content": ""}]
    with pytest.raises(asyncio.TimeoutError):  # completions: like hang_after_headers
        url = f"{sim.base_url}/v1/completions"
        async with session.post(url, json=completion(), timeout=HANG_TIMEOUT) as resp:
            assert resp.status == 200
            await resp.read()
    await wait_until_async(
        lambda: sim.state.counters.aborted == 2, 5, "sim.state.counters.aborted == 2"
    )


async def test_hang_after_first_token(sim: SimHandle, session: aiohttp.ClientSession) -> None:
    await set_fault(session, sim, fault="hang_after_first_token")
    seen: list[bytes] = []

    async def hung_chat() -> None:
        url = f"{sim.base_url}/v1/chat/completions"
        body = chat(max_tokens=3)
        async with session.post(url, json=body, timeout=HANG_TIMEOUT) as resp:
            async for raw in resp.content:
                seen.append(raw)

    with pytest.raises(asyncio.TimeoutError):
        await hung_chat()
    events = [json.loads(raw[6:]) for raw in seen if raw.startswith(b"data: ")]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": " Paris"}]
    assert events[1]["choices"][0]["finish_reason"] is None  # mid-body: more was due
    await wait_until_async(
        lambda: sim.state.counters.aborted == 1, 5, "sim.state.counters.aborted == 1"
    )


async def test_hang_is_bounded_by_hang_max(sim: SimHandle, session: aiohttp.ClientSession) -> None:
    await set_fault(session, sim, fault="hang_before_headers", hang_max="200ms")
    async with session.post(f"{sim.base_url}/v1/completions", json=completion()) as resp:
        assert resp.status == 504
    assert sim.state.counters.failed == 1


async def test_shutdown_releases_hangs_quickly(session: aiohttp.ClientSession) -> None:
    async with running_sim(SimSettings(fault=FaultSpec(fault="hang_after_headers"))) as sim:
        url = f"{sim.base_url}/v1/completions"
        resp = await session.post(url, json=completion(), timeout=aiohttp.ClientTimeout(total=5))
        assert resp.status == 200
        started = time.monotonic()
    assert time.monotonic() - started < 2.0
    assert await resp.read() == b""  # the stream was ended, not left hanging
    resp.release()


# ---------------------------------------------------------------- error faults


async def test_http_500_and_cuda_error(sim: SimHandle, session: aiohttp.ClientSession) -> None:
    url = f"{sim.base_url}/v1/completions"
    await set_fault(session, sim, fault="http_500")
    async with session.post(url, json=completion()) as resp:
        assert resp.status == 500
        assert (await resp.json())["error"]["type"] == "InternalServerError"
    await set_fault(session, sim, fault="cuda_error")
    async with session.post(url, json=completion()) as resp:
        assert resp.status == 500
        message = (await resp.json())["error"]["message"]
    assert "CUDA error: an illegal memory access was encountered" in message
    assert "EngineDeadError" in message
    assert sim.state.counters.failed == 2
    assert sim.state.counters.faulted == 2


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
async def test_error_mid_stream(
    sim: SimHandle, session: aiohttp.ClientSession, endpoint: str
) -> None:
    await set_fault(session, sim, fault="error_mid_stream")
    body = chat() if "chat" in endpoint else completion()
    async with session.post(sim.base_url + endpoint, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await read_events(resp)
    assert events[-1] == "[DONE]"
    assert not [e for e in events if token_of(e)]
    error = json.loads(events[-2])["error"]
    assert "illegal memory access" in error["message"]
    assert (error["type"], error["code"]) == ("InternalServerError", 500)


@pytest.mark.parametrize(
    ("status", "error_type", "message"),
    [
        (429, "RateLimitError", "Too many requests, please try again later"),
        (503, "ServiceUnavailableError", "Server overloaded: too many pending requests"),
    ],
)
async def test_overloaded(
    sim: SimHandle, session: aiohttp.ClientSession, status: int, error_type: str, message: str
) -> None:
    await set_fault(session, sim, fault="overloaded", overload_status=status)
    async with session.post(f"{sim.base_url}/v1/completions", json=completion()) as resp:
        assert resp.status == status
        error = (await resp.json())["error"]
    assert (error["type"], error["message"], error["code"]) == (error_type, message, status)


async def test_garbage_stream_has_no_json_event(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    await set_fault(session, sim, fault="garbage_stream")
    async with session.post(f"{sim.base_url}/v1/completions", json=completion()) as resp:
        assert resp.status == 200
        raw = await resp.read()
    assert raw
    for line in raw.split(b"\n"):
        if line.startswith(b"data: "):
            with pytest.raises(ValueError):
                json.loads(line[6:])
    assert b"[DONE]" not in raw


async def test_close_after_headers(sim: SimHandle, session: aiohttp.ClientSession) -> None:
    await set_fault(session, sim, fault="close_after_headers")
    with pytest.raises(aiohttp.ClientError):
        async with session.post(f"{sim.base_url}/v1/completions", json=completion()) as resp:
            assert resp.status == 200
            await resp.read()
    assert sim.state.counters.failed == 1


async def test_startup_delay_then_ready(sim: SimHandle, session: aiohttp.ClientSession) -> None:
    await set_fault(session, sim, fault="startup_delay", startup_delay="300ms")
    url = f"{sim.base_url}/v1/completions"
    async with session.post(url, json=completion(stream=False)) as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["message"] == "Model is still loading"
    async with session.get(f"{sim.base_url}/health") as resp:
        assert resp.status == 200
    await asyncio.sleep(0.35)
    async with session.post(url, json=completion(stream=False)) as resp:
        assert resp.status == 200


async def test_slow_under_load_adds_ttft_per_in_flight_request(
    session: aiohttp.ClientSession,
) -> None:
    spec = FaultSpec(fault="slow_under_load", ttft=0.0, tpot=0.05, load_ttft_per_request=0.2)
    async with running_sim(SimSettings(fault=spec)) as sim:
        url = f"{sim.base_url}/v1/completions"

        async def ttft(max_tokens: int = 1) -> float:
            started = time.monotonic()
            async with session.post(url, json=completion(max_tokens=max_tokens)) as resp:
                async for raw in resp.content:
                    if raw.startswith(b"data: ") and token_of(raw[6:].decode().strip()):
                        return time.monotonic() - started
            raise AssertionError("no token")

        async def full_stream() -> None:
            async with session.post(url, json=completion(max_tokens=20)) as resp:
                await resp.read()

        assert await ttft() < 0.15
        background = [asyncio.create_task(full_stream()) for _ in range(2)]
        await wait_until_async(lambda: sim.state.in_flight == 2, 5, "sim.state.in_flight == 2")
        assert await ttft() >= 0.39  # two others in flight: 2 x 200 ms
        await asyncio.gather(*background)


async def test_fault_rate_is_seeded_and_partial(session: aiohttp.ClientSession) -> None:
    spec = FaultSpec(fault="http_500", fault_rate=0.5, ttft=0.0, tpot=0.0)

    async def statuses() -> list[int]:
        async with running_sim(SimSettings(fault=spec, seed=7)) as sim:
            url = f"{sim.base_url}/v1/completions"
            result = []
            for _ in range(30):
                async with session.post(url, json=completion(stream=False)) as resp:
                    result.append(resp.status)
                    await resp.read()
            assert sim.state.counters.faulted == result.count(500)
            return result

    first = await statuses()
    assert first == await statuses()
    assert 0 < first.count(500) < 30
    assert set(first) == {200, 500}


# ---------------------------------------------------------------- aborts


# The stream's end follows its last token after a tpot: at the module's 5 ms a loaded core
# could finish a one-token stream before the client's close lands; 0.5 s never does.
@pytest.mark.sim_settings(fault=FaultSpec(ttft=0.01, tpot=0.5))
@pytest.mark.parametrize("max_tokens", [1, 5])
@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
async def test_closing_after_first_token_counts_as_aborted(
    sim: SimHandle, session: aiohttp.ClientSession, max_tokens: int, endpoint: str
) -> None:
    body = (chat if "chat" in endpoint else completion)(max_tokens=max_tokens)
    async with session.post(sim.base_url + endpoint, json=body, headers=PROBE_HEADERS) as resp:
        async for raw in resp.content:
            if raw.startswith(b"data: ") and token_of(raw[6:].decode().strip()):
                break
        resp.close()
    await wait_until_async(
        lambda: sim.state.counters.aborted == 1, 5, "sim.state.counters.aborted == 1"
    )
    assert sim.state.counters.completed == 0
    assert sim.state.counters.probe_requests == 1
    assert invariant_holds(sim.state)


async def test_disconnect_during_ttft_wait_counts_as_aborted(
    session: aiohttp.ClientSession,
) -> None:
    async with running_sim(SimSettings(fault=FaultSpec(ttft=5.0))) as sim:
        url = f"{sim.base_url}/v1/completions"
        with pytest.raises(asyncio.TimeoutError):
            async with session.post(url, json=completion(), timeout=HANG_TIMEOUT) as resp:
                await resp.read()
        await wait_until_async(
            lambda: sim.state.counters.aborted == 1, 5, "sim.state.counters.aborted == 1"
        )
        assert sim.state.in_flight == 0


async def test_aborts_are_seen_without_handler_cancellation(
    session: aiohttp.ClientSession,
) -> None:
    """build_app() run by a plain AppRunner (no handler_cancellation) still counts aborts."""
    app = build_app(SimSettings(fault=FaultSpec(ttft=5.0, tpot=0.005)))
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        state = app[STATE_KEY]
        url = f"http://127.0.0.1:{port}/v1/completions"
        with pytest.raises(asyncio.TimeoutError):  # gone during the TTFT wait
            async with session.post(url, json=completion(), timeout=HANG_TIMEOUT) as resp:
                await resp.read()
        await wait_until_async(
            lambda: state.counters.aborted == 1, 5, "state.counters.aborted == 1"
        )
        # [DONE] follows the one token after a tpot: long enough that the client's close
        # always comes first, even on loaded cores (at 5 ms the stream could complete).
        state.set_fault(FaultSpec(ttft=0.0, tpot=0.5))
        async with session.post(url, json=completion(max_tokens=1)) as resp:
            await resp.content.readline()  # the token event
            resp.close()
        await wait_until_async(
            lambda: state.counters.aborted == 2, 5, "state.counters.aborted == 2"
        )
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- control plane


async def test_set_fault_validates_and_keeps_state_on_error(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    new = await set_fault(session, sim, fault="none", ttft="100ms", ttft_jitter="20ms")
    assert (new["fault"], new["ttft"], new["ttft_jitter"]) == ("none", "100ms", "20ms")
    for bad, named in [
        ({"fault": "meltdown"}, "meltdown"),
        ({"ttft": "soon"}, '"ttft"'),
        ({"fault_rate": -1}, '"fault_rate"'),
        ({"typo": 1}, "typo"),
    ]:
        async with session.post(f"{sim.base_url}/sim/fault", json=bad) as resp:
            assert resp.status == 400
            assert named in (await resp.json())["error"]["message"]
    async with session.post(f"{sim.base_url}/sim/fault", data=b"{oops") as resp:
        assert resp.status == 400
    async with session.get(f"{sim.base_url}/sim/fault") as resp:
        assert await resp.json() == new
    assert sim.state.fault.ttft == 0.1


async def test_stats_record_probes_cache_salt_and_reset(
    session: aiohttp.ClientSession,
) -> None:
    async with running_sim(SimSettings(fault=FAST, recent_size=3)) as sim:
        url = f"{sim.base_url}/v1/completions"
        for i in range(4):
            body = completion(prompt=f"nonce{i} hi", cache_salt=f"salt{i}", stream=False)
            headers = PROBE_HEADERS if i % 2 else {}
            async with session.post(url, json=body, headers=headers) as resp:
                await resp.read()
        async with session.get(f"{sim.base_url}/sim/stats") as resp:
            stats = await resp.json()
        assert (stats["requests"], stats["probe_requests"], stats["completed"]) == (4, 2, 4)
        assert stats["paths"]["/v1/completions"] == 4
        assert stats["last_request"]["cache_salt"] == "salt3"
        assert stats["last_request"]["prompt"] == "nonce3 hi"
        assert stats["last_request"]["probe"] is True
        assert [r["cache_salt"] for r in stats["recent"]] == ["salt1", "salt2", "salt3"]
        assert stats["fault"]["fault"] == "none"
        async with session.post(f"{sim.base_url}/sim/stats/reset") as resp:
            reset = await resp.json()
        assert (reset["requests"], reset["completed"], reset["recent"]) == (0, 0, [])
        assert reset["last_request"] is None


async def test_metrics_use_vllm_names_and_track_in_flight(
    session: aiohttp.ClientSession,
) -> None:
    settings = SimSettings(fault=FaultSpec(ttft=0.0, tpot=0.2), max_num_seqs=4)
    async with running_sim(settings) as sim:
        text = render_metrics(sim.state)
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
            assert f'vllm:{name}{{model_name="sim-model"}} 0.0' in text
            assert f"# TYPE vllm:{name} gauge" in text
        url = f"{sim.base_url}/v1/completions"
        async with session.post(url, json=completion(max_tokens=5)) as resp:
            await resp.content.readline()
            async with session.get(f"{sim.base_url}/metrics") as metrics:
                assert metrics.headers["Content-Type"].startswith("text/plain")
                text = await metrics.text()
            resp.close()
    assert 'vllm:num_requests_running{model_name="sim-model"} 1.0' in text
    assert 'vllm:kv_cache_usage_perc{model_name="sim-model"} 0.25' in text


# ---------------------------------------------------------------- many ports


async def test_many_ports_share_one_state(session: aiohttp.ClientSession) -> None:
    async with running_sim(SimSettings(fault=FAST), port_count=5) as sim:
        assert len(set(sim.ports)) == 5
        for base in sim.base_urls:
            async with session.post(f"{base}/v1/completions", json=completion()) as resp:
                await resp.read()
        async with session.post(f"{sim.base_urls[4]}/sim/fault", json={"fault": "http_500"}):
            pass
        async with session.post(f"{sim.base_urls[0]}/v1/completions", json=completion()) as resp:
            assert resp.status == 500
        async with session.get(f"{sim.base_urls[2]}/sim/stats") as resp:
            stats = await resp.json()
    assert (stats["requests"], stats["completed"], stats["failed"]) == (6, 5, 1)


async def test_serve_runs_until_cancelled_even_with_a_hang(
    session: aiohttp.ClientSession,
) -> None:
    ports = [free_port() for _ in range(3)]
    ready: asyncio.Future[SimHandle] = asyncio.get_running_loop().create_future()
    settings = SimSettings(fault=FaultSpec(fault="hang_before_headers"))
    server = asyncio.create_task(serve("127.0.0.1", ports, settings, on_ready=ready.set_result))
    handle = await asyncio.wait_for(ready, 5)
    assert handle.ports == tuple(ports)
    hung = asyncio.create_task(
        session.post(f"http://127.0.0.1:{ports[1]}/v1/completions", json=completion())
    )
    await wait_until_async(lambda: handle.state.in_flight == 1, 5, "handle.state.in_flight == 1")
    started = time.monotonic()
    server.cancel()
    with pytest.raises(asyncio.CancelledError):
        await server
    assert time.monotonic() - started < 2.0
    response = await asyncio.wait_for(hung, 2)
    assert response.status == 503  # released by shutdown
    response.release()
    with pytest.raises(aiohttp.ClientConnectionError):
        await session.get(f"http://127.0.0.1:{ports[0]}/health")


async def test_serve_reports_a_busy_port() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(OSError):
            await serve("127.0.0.1", [busy.getsockname()[1]], SimSettings())


# ---------------------------------------------------------------- CLI parsing


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llm-health")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_arguments_build_settings() -> None:
    args = parse(
        [
            *("sim", "--port", "9000", "--port-count", "3", "--fault", "overloaded"),
            *("--ttft", "80ms", "--overload-status", "503", "--fault-rate", "0.25"),
            *("--seed", "3", "--model", "m"),
        ]
    )
    settings = settings_from_args(args)
    assert (settings.model, settings.seed) == ("m", 3)
    assert settings.fault == FaultSpec(
        fault="overloaded", ttft=0.08, overload_status=503, fault_rate=0.25
    )
    assert args.func is not None and args.port_count == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "9000", "--ttft", "fast"], '"fast" is not a duration'),
        (["--port", "0"], "port must be between 1 and 65535"),
        (["--port", "9000", "--fault", "meltdown"], "invalid choice: 'meltdown'"),
        (["--port", "9000", "--fault-rate", "2"], "must be between 0 and 1"),
        (["--port", "9000", "--overload-status", "500"], "invalid choice: 500"),
        (["--port", "9000", "--port-count", "0"], "must be at least 1"),
        ([], "--port"),
    ],
)
def test_cli_rejects_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(["sim", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_ports_past_65535(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["sim", "--port", "65535", "--port-count", "2"])
    with pytest.raises(SystemExit) as exit_info:
        args.func(args)
    assert exit_info.value.code == 2
    assert "goes past port 65535" in capsys.readouterr().err


def test_every_fault_has_a_handler_and_is_a_cli_choice() -> None:
    from llm_health.sim import behaviours

    handlers: dict[str, Callable[..., Awaitable[Any]]] = dict(behaviours._FAULT_HANDLERS)
    assert set(handlers) == set(FAULTS)
