"""The probe's own HTTP/1.1 exchange (docs/design.md §2, §16.10): an ``asyncio.Protocol``
whose bytes go through llhttp (``httptools.HttpResponseParser``: status line, headers and
chunked framing decoded in C), and a small pool of kept connections.

Why not aiohttp here: a micro-probe is one POST and a few hundred bytes of answer, and
aiohttp's per-request machinery costs more CPU than the whole of this exchange
(``bench/probe_client_cost.py``). The engines' side reads (GET /metrics and the like) use it too, on
connections of their own; aiohttp stays for the HTTP server and webhooks. What this
module does not do: redirects (a probe follows none: a 3xx is the endpoint's answer),
content encodings (none is asked for), proxies, cookies.

Every size is bounded (the head by ``MAX_HEAD_BYTES``, every other byte after it by
``MAX_FRAMING_BYTES``, the body by the caller), every failure is an exception the prober
turns into a ``ProbeResult``: ``ConnectFailed``, ``ConnectionBroken`` (lost before the whole
answer), ``ResponseError`` (bytes llhttp refuses, an upgrade, a head too large, too much
framing, bytes while idle or before the request went out). Interim 1xx responses before
the answer are read past and counted (``Connection.interim``). Nothing here logs.

Three modules, each with one job: ``connection`` (one connection and its llhttp parser),
``pool`` (the kept connections, ``Connections``), ``stamped`` (a transport that reads its
socket with ``recvmsg``, its bytes timed by the kernel).
"""

from llm_health.probe.http1.connection import (
    MAX_FRAMING_BYTES,
    MAX_HEAD_BYTES,
    USER_AGENT,
    ConnectFailed,
    Connection,
    ConnectionBroken,
    ResponseError,
    Route,
    UnsendableRequest,
    request_head,
    route_of,
)
from llm_health.probe.http1.pool import (
    IDLE_TIMEOUT_S,
    MAX_IDLE_PER_ENDPOINT,
    SWEEP_EVERY_S,
    Connections,
)
from llm_health.probe.http1.stamped import STAMPS, StampedConnect

__all__ = [
    "IDLE_TIMEOUT_S",
    "MAX_FRAMING_BYTES",
    "MAX_HEAD_BYTES",
    "MAX_IDLE_PER_ENDPOINT",
    "STAMPS",
    "SWEEP_EVERY_S",
    "USER_AGENT",
    "ConnectFailed",
    "Connection",
    "ConnectionBroken",
    "Connections",
    "ResponseError",
    "Route",
    "StampedConnect",
    "UnsendableRequest",
    "request_head",
    "route_of",
]
