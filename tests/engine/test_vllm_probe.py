"""The probe against real vLLM (docs/engines/vllm.md): it bypasses the prefix cache with
``cache_salt`` (docs/design.md §2.2), its one-token request ends with its token, and a
stream its client leaves is aborted by vLLM (docs/design.md §2.4), all read from vLLM's
own metrics and log. One server for the module (``--block-size 32``, prefix caching on).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.configs import plugin_settings
from tests.engine.vllm import SERVED_NAME, StartVllm, VllmServer
from tests.processes import PluginProcess

BLOCK = 32  # vLLM caches whole blocks only; the CPU attention takes multiples of 32
# With the chat template, 41 prompt tokens: one full block the next probe could hit.
PROMPT = "ba kolu mesi the and of you hi tikaro sutavo nemi rako"
PROBES = 6
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def server(vllm_server: StartVllm) -> VllmServer:
    return vllm_server(block_size=BLOCK)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., PluginProcess]]:
    """``serve`` probing the server every 300 ms on the chat API; stopped after."""
    started: list[PluginProcess] = []

    def start(server: VllmServer, **probe: Any) -> PluginProcess:
        settings = plugin_settings(
            [server.address],
            listen=False,
            probe={
                "api": "openai-chat",
                "model": SERVED_NAME,
                "prompt": PROMPT,
                "interval": "300ms",
                "timeout": "5s",
                "healthy_ttft": "2s",
                "verify": {"enabled": False},  # random weights: no known answer
                **probe,
            },
        )
        plugin = PluginProcess(tmp_path / f"plugin-{len(started)}", settings)
        started.append(plugin)
        return plugin.start().wait_ready()

    yield start
    for plugin in started:
        plugin.stop()


COUNTERS = (
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


def counters(server: VllmServer) -> dict[str, float]:
    """COUNTERS and ``finished`` (requests vLLM finished by themselves: every
    ``request_success_total`` but ``abort``), from one read of ``/metrics``: vLLM counts a
    one-token request's token and its end in the same engine step."""
    metrics = server.metrics()

    def total(name: str) -> float:
        return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))

    read = {name: total(name) for name in COUNTERS}
    read["finished"] = sum(
        value
        for key, value in metrics.items()
        if key.startswith("vllm:request_success_total{") and 'finished_reason="abort"' not in key
    )
    return read


def probe_run(server: VllmServer, plugin: PluginProcess) -> dict[str, float]:
    """What vLLM counted while ``plugin`` sent PROBES probes (and its log's ``aborted``
    lines): both readings are taken while it runs (stopping it mid-probe would leave a
    request to abort)."""
    deadline = time.monotonic() + 60.0
    first = {**counters(server), "aborted": server.log_text().count(" aborted.")}
    while counters(server)["finished"] - first["finished"] < PROBES:
        assert time.monotonic() < deadline, "the probes did not reach vLLM"
        time.sleep(0.2)
    last = {**counters(server), "aborted": server.log_text().count(" aborted.")}
    plugin.stop()
    return {name: last[name] - first[name] for name in first}


def test_probes_add_no_prefix_cache_hits_and_without_the_salt_they_would(
    server: VllmServer, serve: Callable[..., PluginProcess]
) -> None:
    salted = probe_run(server, serve(server))  # cache_bust auto: cache_salt on vLLM
    # The premise: each probe's prompt spans at least one full block, so a repeat could hit.
    assert salted["vllm:prompt_tokens_total"] / salted["finished"] >= BLOCK, salted
    assert salted["vllm:prefix_cache_hits_total"] == 0, salted
    # The same probes without a cache bypass hit the blocks the previous ones left.
    plain = probe_run(server, serve(server, cache_bust="none"))
    assert plain["vllm:prefix_cache_hits_total"] >= BLOCK * (plain["finished"] - 1), plain


def test_the_probe_request_ends_with_its_token(
    server: VllmServer, serve: Callable[..., PluginProcess]
) -> None:
    """docs/design.md §2.4: ``max_tokens: 1``; vLLM ends the stream at once (finish reason
    ``length``), so the probe never has to cut it: one token generated per probe, nothing
    aborted."""
    counted = probe_run(server, serve(server))
    assert counted["vllm:generation_tokens_total"] == counted["finished"] >= PROBES, counted
    assert counted["aborted"] == 0, counted


def first_token_then_close(server: VllmServer, max_tokens: int) -> None:
    """A streamed chat request for ``max_tokens`` tokens, left after its first token."""
    body = json.dumps(
        {
            "model": SERVED_NAME,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {server.address}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30.0) as connection:
        connection.sendall(head + body)
        received = b""
        while b'"content":"' not in received.replace(b'"content":""', b""):
            chunk = connection.recv(65536)
            assert chunk, f"the stream ended before a token: {received[-300:]!r}"
            received += chunk


def test_a_stream_left_after_its_first_token_is_aborted(server: VllmServer) -> None:
    """What the probe relies on when it closes a stream that goes on after the verdict
    (docs/design.md §2.4): vLLM aborts the request instead of decoding on."""
    tokens_before = server.metric("vllm:generation_tokens_total")
    aborted_before = server.log_text().count(" aborted.")
    first_token_then_close(server, 400)
    deadline = time.monotonic() + 30.0
    while server.log_text().count(" aborted.") == aborted_before:
        assert time.monotonic() < deadline, "vLLM did not log the abort"
        time.sleep(0.1)
    while server.metric("vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the request still runs"
        time.sleep(0.1)
    generated = server.metric("vllm:generation_tokens_total") - tokens_before
    assert 1 <= generated < 400, generated
