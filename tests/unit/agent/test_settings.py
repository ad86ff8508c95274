"""``--engine`` and ``--http`` of ``llm-health agent`` (``agent.settings``): what is taken,
and for everything else a message that says what to write instead."""

from __future__ import annotations

import re

import pytest

from llm_health.agent.settings import AgentSettings, engine_address, http_bind


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "127.0.0.1:8000"),
        ("http://10.1.2.3:80", "10.1.2.3:80"),
        ("http://[::1]:8000", "[::1]:8000"),
    ],
)
def test_an_http_ip_port_url_is_taken(url: str, address: str) -> None:
    assert engine_address(url) == address


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("127.0.0.1:8000", "write the scheme too"),
        ("https://127.0.0.1:8443", "https is not supported"),
        ("grpc://127.0.0.1:8000", "the scheme must be http"),
        ("http://localhost:8000", "'localhost' is a host name; write the IP address"),
        ("http://vllm.default.svc:8000", "is a host name"),
        ("http://127.0.0.1", "give the engine's port"),
        ("http://[::1]", "give the engine's port"),
        ("http://127.0.0.1:99999", "out of range"),
        ("http://127.0.0.1:8000/v1/completions", "give no path"),
        ("http://127.0.0.1:8000/?x=1", "give no path"),
        ("http://user:pw@127.0.0.1:8000", "no credentials in the URL"),
        ("http://127.0.0.1:٨٠٠٠", "give the engine's port"),
    ],
)
def test_anything_else_says_what_to_write(url: str, says: str) -> None:
    with pytest.raises(
        ValueError, match=re.escape("e.g. --engine http://127.0.0.1:8000")
    ) as caught:
        engine_address(url)
    assert says in str(caught.value)


@pytest.mark.parametrize("bind", ["0.0.0.0:18090", "127.0.0.1:1", "[::]:18090"])
def test_http_binds(bind: str) -> None:
    assert http_bind(bind) == bind


@pytest.mark.parametrize(
    ("bind", "says"),
    [
        ("18090", "is not host:port"),
        ("0.0.0.0:0", "out of range"),
        ("localhost:18090", "write an IP address to listen on"),
        ("unix:/tmp/agent.sock", "is not host:port"),
    ],
)
def test_bad_http_binds_say_what_to_write(bind: str, says: str) -> None:
    with pytest.raises(ValueError, match="--http") as caught:
        http_bind(bind)
    assert says in str(caught.value)


def test_defaults() -> None:
    settings = AgentSettings()
    assert settings.ready_when_degraded is True
    assert settings.restart_after == 300.0
