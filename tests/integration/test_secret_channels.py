"""A backend that hands the probe's own API key back, in every way it can reach an
operator (docs/design.md §10): as its served model id, as its known-answer text, echoed
lower-cased in an error, and in an error body that puts the key across the probe's 64 KiB
read limit. The key, and any prefix of it of 8 characters or more, in any case, must
appear in no channel: the logs, /status, /metrics, the admin API (Get, Watch, ProbeNow),
``llm-health status``, the alert webhook's body and a remediation hook's argv.

The real runtime runs in this test's loop (tests/runtime.py) against in-process aiohttp
backends on loopback. Every backend answers normally until the attack starts; a control
endpoint answers normally throughout and must stay HEALTHY. During the attack /livez is
polled every 50 ms and must answer within 100 ms; the bytes logged are bounded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web

from llm_health.adminpb import admin_pb2 as pb
from llm_health.adminpb import admin_pb2_grpc as pb_grpc
from llm_health.app.assemble import build_runtime
from llm_health.cli import main
from llm_health.config import parse_config
from llm_health.model.states import State
from llm_health.probe.client import MAX_ERROR_BODY
from tests.alerts_receiver import Receiver
from tests.polling import wait_until_async
from tests.ports import free_port
from tests.runtime import Running

# timed: /livez (or the agent's answers) timed against tight bounds while the attack runs
pytestmark = [pytest.mark.timeout(90), pytest.mark.timed]

KEY = "Zq8TmV3xRb7NpK2wYc5HdF9jLs4GtE6uAo1iWkXyPv0Mn3Qr"  # 48 characters, mixed case
SHOWN_BEFORE_LIMIT = 44  # of the key's characters that fall before the read limit
ATTACK_S = 4.0
LIVEZ_WITHIN_S = 0.1
MAX_LOG_BYTES = 128 * 1024  # logged during the attack, every field (measured: 20 KB)
HOSTILE = ("model-id", "answer", "lower", "boundary")

CONFIG = """
server: {{grpc: "127.0.0.1:{grpc}", http: "127.0.0.1:{http}"}}
probe:
  interval: 200ms
  timeout: 1s
  healthy_ttft: 500ms
  healthy_after: 1
  unhealthy_after: 1
  startup_grace: 1s
  headers: {{Authorization: "Bearer ${{BACKEND_KEY}}"}}
  verify: {{every: 1s}}
  engine_metrics: null
xds: {{warm_start_timeout: 1s}}
alerts:
  webhooks:
    - {{url: "{webhook}", on: [unhealthy, fatal, recovered, remediation]}}
remediation:
  - when: {{state: unhealthy, for: 1s}}
    run: {hook}
limits: {{cooldown: 1h, max_per_hour: 100, max_concurrent_per_cluster: 5}}
clusters:
  - name: model-id
    model: served-model
    endpoints: [{{address: "{model-id}"}}]
  - name: answer
    probe: {{verify: {{expect: "Paris"}}}}
    endpoints: [{{address: "{answer}"}}]
  - name: lower
    endpoints: [{{address: "{lower}"}}]
  - name: boundary
    endpoints: [{{address: "{boundary}"}}]
  - name: control
    endpoints: [{{address: "{control}"}}]
"""


def leaks(text: str) -> bool:
    """Whether ``text`` shows the key or a prefix of it of 8 characters or more, in any
    case (every such prefix starts with the key's first 8 characters)."""
    return KEY[:8].lower() in text.lower()


class Backend:
    """One endpoint: normal service, then (once ``attack`` is set) its hostile answer."""

    def __init__(self, kind: str, attack: asyncio.Event) -> None:
        self.kind, self.attack = kind, attack
        self.runner: web.AppRunner | None = None
        self.address = ""

    async def start(self) -> Backend:
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.address = f"127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    @property
    def hostile(self) -> bool:
        return self.attack.is_set() and self.kind in HOSTILE

    async def models(self, _request: web.Request) -> web.Response:
        served = KEY if self.hostile and self.kind == "model-id" else "served-model"
        return web.json_response({"object": "list", "data": [{"id": served, "object": "model"}]})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        if self.hostile and self.kind == "lower":
            message = f"invalid api key {KEY.lower()}"
            return web.json_response({"error": {"message": message}}, status=500)
        if self.hostile and self.kind == "boundary":
            # 64 KiB read: the key starts 44 characters before the limit, after blanks a
            # clipped message folds away ("x <key...>").
            pad = MAX_ERROR_BODY - 1 - SHOWN_BEFORE_LIMIT
            return web.Response(status=500, text="x" + " " * pad + KEY + " and more")
        pieces = [" Paris", " is"]
        if self.hostile and self.kind == "answer":
            pieces = [" " + KEY[:20], KEY[20:]]  # the key split over two tokens
        return await _stream(request, pieces)


async def _stream(request: web.Request, pieces: list[str]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for index, text in enumerate(pieces):
        finish = "length" if index == len(pieces) - 1 else None
        event = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
        await response.write(f"data: {json.dumps(event)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


@asynccontextmanager
async def backends(attack: asyncio.Event) -> AsyncIterator[dict[str, Backend]]:
    started = {kind: await Backend(kind, attack).start() for kind in (*HOSTILE, "control")}
    try:
        yield started
    finally:
        for backend in started.values():
            await backend.stop()


def hook_argv(path: Path) -> str:
    code = "import sys; open(sys.argv[1], 'a').write(repr(sys.argv[2:]) + '\\n')"
    fields = ("{cluster}", "{address}", "{host}", "{port}", "{state}", "{cause}")
    return json.dumps([sys.executable, "-c", code, str(path), *fields])


async def watch(stub: Any, seen: list[str]) -> None:
    async for message in stub.WatchEndpoints(pb.WatchEndpointsRequest()):
        seen.append(str(message))


async def poll_livez(base: str, stop: asyncio.Event, worst: list[float]) -> None:
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            started = time.perf_counter()
            async with session.get(f"{base}/livez") as response:
                assert response.status == 200
            worst.append(time.perf_counter() - started)
            await asyncio.sleep(0.05)


async def cli_status(*args: str) -> int:
    return await asyncio.to_thread(main, ["status", *args])


async def test_the_key_a_backend_hands_back_reaches_no_channel(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    attack = asyncio.Event()
    receiver = await Receiver().start()
    argv_file = tmp_path / "argv.txt"
    async with backends(attack) as started:
        text = CONFIG.format(
            grpc=free_port(),
            http=free_port(),
            webhook=receiver.url,
            hook=hook_argv(argv_file),
            **{kind: b.address for kind, b in started.items()},
        )
        runtime = build_runtime(parse_config(text, "secrets.yaml", {"BACKEND_KEY": KEY}))
        caplog.set_level(logging.DEBUG)
        try:
            async with Running(runtime):
                await wait_until_async(lambda: not runtime.ready_problems(), 15, "ready")
                await wait_until_async(
                    lambda: all(
                        e.state is State.HEALTHY
                        for c in runtime.control.snapshot().clusters.values()
                        for e in c.endpoints
                    ),
                    15,
                    "every endpoint HEALTHY",
                )
                channel = grpc.aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}")
                stub = pb_grpc.AdminStub(channel)
                watched: list[str] = []
                watcher = asyncio.create_task(watch(stub, watched))
                base = f"http://127.0.0.1:{runtime.http_port}"
                stop_polling, worst = asyncio.Event(), []
                poller = asyncio.create_task(poll_livez(base, stop_polling, worst))
                control = started["control"].address
                control_changes: list[str] = []
                runtime.control.on_transition(
                    lambda c, a, t, _r: (
                        control_changes.append(t.to_state.value)
                        if a == control and t.changed
                        else None
                    )
                )
                logged_before = len(caplog.records)
                attack.set()
                attacked_at = time.monotonic()

                def hostile_down() -> bool:
                    snapshot = runtime.control.snapshot()
                    return all(
                        snapshot.clusters[name].endpoints[0].state is State.UNHEALTHY
                        for name in HOSTILE
                    )

                await wait_until_async(hostile_down, 15, "every hostile endpoint UNHEALTHY")
                await asyncio.sleep(max(0.0, ATTACK_S - (time.monotonic() - attacked_at)))
                await wait_until_async(
                    lambda: argv_file.exists() and len(argv_file.read_text().splitlines()) >= 4,
                    10,
                    "a remediation hook run per hostile endpoint",
                )
                logged = "\n".join(_record(r) for r in caplog.records[logged_before:])
                stop_polling.set()
                await poller
                listed = await stub.ListEndpoints(pb.ListEndpointsRequest())
                probed = [
                    await stub.ProbeNow(pb.EndpointRequest(cluster=name, address=b.address))
                    for name, b in zip(HOSTILE, (started[k] for k in HOSTILE), strict=True)
                ]
                async with aiohttp.ClientSession() as session:
                    async with session.get(f"{base}/status") as response:
                        status_http = await response.text()
                    async with session.get(f"{base}/metrics") as response:
                        metrics = await response.text()
                capsys.readouterr()
                admin = f"127.0.0.1:{runtime.grpc_port}"
                assert await cli_status("--admin", admin) == 0
                assert await cli_status("--admin", admin, "--json") == 0
                cli_out = capsys.readouterr().out
                await receiver.wait_accepted(len(HOSTILE), 10)
                watcher.cancel()
                await channel.close()
        finally:
            await receiver.stop()
    # The attack happened, and was seen: each hostile endpoint went down for it.
    status = runtime.status()
    shown = {c["name"]: c["endpoints"][0] for c in status["clusters"]}
    assert "wrong model" in shown["model-id"]["reason"], shown
    assert "wrong answer" in shown["answer"]["reason"], shown
    assert all(shown[n]["last_probe"]["status"] == 500 for n in ("lower", "boundary")), shown
    channels = {
        "logs": "\n".join(_record(r) for r in caplog.records),
        "/status": json.dumps(status) + status_http,
        "/metrics": metrics,
        "admin ListEndpoints": str(listed),
        "admin WatchEndpoints": "\n".join(watched),
        "admin ProbeNow": "\n".join(str(p) for p in probed),
        "llm-health status": cli_out,
        "alert webhook": "\n".join(json.dumps(r.body) for r in receiver.requests),
        "remediation argv": argv_file.read_text(),
    }
    leaked = [f"{name}: {_around(text)}" for name, text in channels.items() if leaks(text)]
    assert not leaked, "the key shows in:\n" + "\n".join(leaked)
    assert control_changes == [], control_changes  # the healthy endpoint never moved
    assert worst and max(worst) < LIVEZ_WITHIN_S, max(worst)
    assert len(logged.encode()) < MAX_LOG_BYTES, len(logged.encode())


@pytest.mark.parametrize("kind", ["model-id", "lower", "boundary"])
async def test_llm_health_probe_prints_no_key(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``llm-health probe`` shows the discovered model id and each probe's detail."""
    attack = asyncio.Event()
    attack.set()
    backend = await Backend(kind, attack).start()
    try:
        args = ["probe", f"http://{backend.address}", "--count", "1", "--timeout", "2s"]
        await asyncio.to_thread(main, [*args, "--header", f"Authorization: Bearer {KEY}"])
    finally:
        await backend.stop()
    out = capsys.readouterr().out
    assert "probe 1:" in out, out
    assert not leaks(out), _around(out)


def _record(record: logging.LogRecord) -> str:
    """A log record with every field it carries (more than a JSON log line shows)."""
    return f"{record.getMessage()} {record.__dict__}"


def _around(text: str) -> list[str]:
    """Where the key shows, with some context (for the failure message)."""
    lowered, head, found, start = text.lower(), KEY[:8].lower(), [], 0
    while (at := lowered.find(head, start)) >= 0 and len(found) < 3:
        found.append(text[max(0, at - 40) : at + 60])
        start = at + 1
    return found
