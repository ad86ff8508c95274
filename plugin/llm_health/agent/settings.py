"""What configures ``llm-health agent`` (docs/agent.md, docs/configuration.md): the
``agent:`` section of its file, and the rules for its two addresses on the command line
(``--engine``: the engine's URL; ``--http``: where the kubelet asks). The file's ``probe:``
section is ``serve``'s (``config.schema.ProbeSettings``); ``config.agent`` composes both.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field

from llm_health.core.addresses import is_ascii_number, is_ip_host, split_address
from llm_health.core.settings import Duration, Frozen
from llm_health.probe.loop import EventLoopSetting

DEFAULT_RESTART_AFTER_S = 300.0
DEFAULT_HTTP = "0.0.0.0:18090"
ENGINE_EXAMPLE = "http://127.0.0.1:8000"


class AgentSettings(Frozen):
    """``agent:``. ``ready_when_degraded``: a DEGRADED engine (slow, silent in flight, a
    single failure) stays Ready, as the gateway side keeps it routed at a reduced weight;
    DEGRADED for load (overloaded, saturated) is Ready whatever this says
    (docs/design.md §3.5).
    ``restart_after``: how long the engine must be UNHEALTHY, without a break, for a cause
    a restart can cure before ``/livez`` asks the kubelet to restart it; null: never."""

    ready_when_degraded: bool = True
    restart_after: Duration | None = Field(DEFAULT_RESTART_AFTER_S)
    # As ``server.event_loop`` (docs/design.md §16.10): "auto" is uvloop when installed.
    event_loop: EventLoopSetting = "auto"


def engine_address(url: str) -> str:
    """The ``host:port`` of ``--engine URL``; ValueError saying what to write instead.
    Only ``http://IP:PORT``: the engine is in the agent's own pod (loopback, no TLS, no
    name to resolve), and the probe's path is ``probe.path``, not part of the URL."""
    example = f"e.g. --engine {ENGINE_EXAMPLE}"
    if "://" not in url:
        raise ValueError(f"{url!r} is not a URL: write the scheme too, {example}")
    parts = urlsplit(url)
    if parts.scheme == "https":
        raise ValueError(
            f"{url!r}: https is not supported; the agent probes the engine in its own pod "
            f"over plain http, {example}"
        )
    if parts.scheme != "http":
        raise ValueError(f"{url!r}: the scheme must be http, {example}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(
            f"{url!r}: give no path (the probe's path is probe.path in --config), {example}"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{url!r}: no credentials in the URL (use probe.headers), {example}")
    return _ip_port(url, parts.netloc, example)


def _ip_port(url: str, netloc: str, example: str) -> str:
    if not is_ascii_number(netloc.rpartition(":")[2]):
        raise ValueError(f"{url!r}: give the engine's port, {example}")
    try:
        host, _port = split_address(netloc)
    except ValueError as exc:  # a port out of range, a host that is no name nor IP
        raise ValueError(f"{url!r}: {exc}, {example}") from None
    if not is_ip_host(host):
        raise ValueError(
            f"{url!r}: {host!r} is a host name; write the IP address the engine listens "
            f"on in this pod, {example}"
        )
    return netloc


def http_bind(bind: str) -> str:
    """``--http HOST:PORT`` (an IP literal host); ValueError saying what to write."""
    try:
        host, _port = split_address(bind)
    except ValueError as exc:
        raise ValueError(f"{exc}; write --http HOST:PORT, e.g. --http {DEFAULT_HTTP}") from None
    if not is_ip_host(host):
        raise ValueError(f'"{bind}": write an IP address to listen on, e.g. --http {DEFAULT_HTTP}')
    return bind
