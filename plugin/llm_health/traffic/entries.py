"""One Envoy HTTP access-log entry -> one ``Request`` (pure; docs/design.md §15.1).

The entry comes from ``envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs``
(``envoy.data.accesslog.v3.HTTPAccessLogEntry``) and is untrusted: anything missing or out
of range makes ``decode`` return None (the caller counts it), never raise.

What an outcome is (per upstream host, ``common_properties.upstream_remote_address``):
- error: a 5xx, or a reset or timeout Envoy saw upstream (response flags UF connection
  failure, UC connection termination, UR remote reset, UT upstream request timeout, UO
  overflow, URX retry limit, UPE protocol error, UMSDR max stream duration) — whether or
  not a status code was sent;
- success: anything else with a status code (4xx are the client's, not the engine's);
- neither: no status and no upstream fault (the client went away first: a user closing a
  stream). It still counts as a request, and its duration as one;
- not counted: requests carrying ``X-LLM-Probe`` (the config logs that header:
  ``additional_request_headers_to_log``), intermediate (periodic) entries, entries with no
  upstream host (nothing to blame: no healthy upstream, no route).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Any

PROBE_HEADER = "x-llm-probe"
ERROR_FLAGS = (
    "upstream_connection_failure",
    "upstream_connection_termination",
    "upstream_remote_reset",
    "upstream_request_timeout",
    "upstream_overflow",
    "upstream_retry_limit_exceeded",
    "upstream_protocol_error",
    "upstream_max_stream_duration_reached",
)
MAX_SECONDS = 86_400.0  # a duration beyond a day is not a real request's
MAX_CACHED_ADDRESSES = 8192
_ERROR_FLAGS = frozenset(ERROR_FLAGS)
_ADDRESSES: dict[tuple[str, int], str | None] = {}
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Request:
    """One real request's outcome at one upstream endpoint. Seconds; ``first_byte_s``:
    time to the first upstream byte (None if none came)."""

    cluster: str
    address: str  # "ip:port" as the board names endpoints ("[v6]:port" for IPv6)
    status: int
    error: bool
    duration_s: float
    first_byte_s: float | None
    attempts: int
    flags: tuple[str, ...]

    @property
    def success(self) -> bool:
        return 0 < self.status < 500 and not self.error


def decode(entry: Any) -> Request | None:
    """The request of one ``HTTPAccessLogEntry``, or None when it does not count."""
    common = entry.common_properties
    if common.intermediate_log_entry:
        return None
    if _is_probe(entry.request.request_headers):
        return None
    address = _address(common.upstream_remote_address)
    if address is None:
        return None
    field = "duration" if common.HasField("duration") else "time_to_last_downstream_tx_byte"
    duration = _seconds(getattr(common, field))
    if duration is None:
        return None
    status = entry.response.response_code.value if entry.response.HasField("response_code") else 0
    flags = _error_flags(common) if common.HasField("response_flags") else ()
    first = (
        _seconds(common.time_to_first_upstream_rx_byte)
        if common.HasField("time_to_first_upstream_rx_byte")
        else None
    )
    return Request(
        cluster=common.upstream_cluster[:200],
        address=address,
        status=status if 0 <= status <= 999 else 0,
        error=status >= 500 or bool(flags),
        duration_s=duration,
        first_byte_s=first,
        attempts=max(1, min(common.upstream_request_attempt_count, 100)),
        flags=flags,
    )


def _error_flags(common: Any) -> tuple[str, ...]:
    """The upstream error flags set (only set fields are listed: most entries have none)."""
    return tuple(
        field.name
        for field, value in common.response_flags.ListFields()
        if value and field.name in _ERROR_FLAGS
    )


def _is_probe(headers: Any) -> bool:
    value = headers.get(PROBE_HEADER)
    return value is not None and value.strip().lower() not in ("", "0", "false")


def _address(address: Any) -> str | None:
    """``ip:port`` of a socket address; None unless it is an IP literal and a port. The
    few upstream hosts recur in every entry: parsed once each (a bounded cache)."""
    socket = address.socket_address
    key = (socket.address, socket.port_value)
    found = _ADDRESSES.get(key, _MISSING)
    if found is _MISSING:
        found = _parse_address(*key)
        if len(_ADDRESSES) >= MAX_CACHED_ADDRESSES:
            _ADDRESSES.clear()
        _ADDRESSES[key] = found
    return found  # type: ignore[return-value]


def _parse_address(host: str, port: int) -> str | None:
    if not host or not 0 < port < 65536 or len(host) > 64:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _seconds(duration: Any) -> float | None:
    value = duration.seconds + duration.nanos / 1e9
    return value if math.isfinite(value) and 0 <= value <= MAX_SECONDS else None
