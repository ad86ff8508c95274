"""Pure rules of DNS discovery: which records make endpoints, when to resolve again, what
a fault is called. No I/O, no clock; table-tested in tests/unit/discovery/.

Everything here reads what a DNS server sent: a peer. Counts are bounded, addresses are
parsed (never passed on as text), names are made printable before they reach a log.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from llm_health.model.board import EndpointSpec
from llm_health.model.redact import printable_line

#: A record's TTL may slow resolution down to this at most (or to ``refresh`` if that is
#: longer): a day-long TTL from a misconfigured zone must not hide a scale-out for a day.
MAX_TTL_WAIT_S = 60.0
#: The next resolution waits at least this many times the CPU the last one took (decoding
#: the answer, looking up targets): whatever a server answers, a cluster's discovery takes
#: at most a tenth of a core (docs/design.md §11.2).
COST_FACTOR = 9.0
MAX_REASON = 200
_BROADCAST = ipaddress.IPv4Address(
    "255.255.255.255"
)  # characters of a fault's text kept for logs, /status and alerts


class FaultKind(enum.Enum):
    """Why a resolution gave no usable set. Every one keeps the last known set
    (docs/design.md §11.3)."""

    TIMEOUT = "timeout"  # no server answered within dns.timeout
    SERVFAIL = "servfail"  # every server answered SERVFAIL or REFUSED, or was unreachable
    NXDOMAIN = "nxdomain"  # the name does not exist
    EMPTY = "empty"  # the name exists but has no usable record
    BAD_ANSWER = "bad_answer"  # records we cannot use (addresses dropped, see reason)


class DnsFault(Exception):
    """A resolution that must not change the endpoint set."""

    def __init__(self, kind: FaultKind, reason: str) -> None:
        self.kind = kind
        self.reason = printable_line(reason, MAX_REASON)
        super().__init__(f"{kind.value}: {self.reason}")


@dataclass(frozen=True, slots=True)
class Record:
    """One (address, port) an answer named, and how long the answer may be cached."""

    ip: str
    port: int
    ttl: int


@dataclass(frozen=True, slots=True)
class Found:
    """A successful resolution: the endpoints (sorted, unique), how long its records may
    be cached (the smallest TTL), what was dropped and why (for one log line), and the
    CPU seconds the resolution took (``next_refresh``)."""

    endpoints: tuple[EndpointSpec, ...]
    ttl: int
    dropped: tuple[str, ...] = ()
    cost_s: float = 0.0


def endpoint_address(ip: str, port: int) -> str:
    """The "host:port" text of an endpoint, as the config writes it ("[v6]:port")."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def unusable(ip: str) -> str | None:
    """Why ``ip`` cannot be an endpoint, or None. Unspecified, multicast and broadcast
    addresses route nowhere useful; an IPv6 link-local address needs a zone that DNS
    cannot give. Loopback is allowed (a sidecar model server, and the tests)."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return "not an IP address"
    return _unusable(address)


def _unusable(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if address.is_unspecified:
        return "unspecified address"
    if address.is_multicast:
        return "multicast address"
    if address == _BROADCAST:
        return "broadcast address"
    if isinstance(address, ipaddress.IPv6Address) and address.is_link_local:
        return "IPv6 link-local address (no zone)"
    return None


def endpoints_from(records: Iterable[Record], weight: int, limit: int) -> Found:
    """The endpoint set an answer gives: unusable addresses dropped, duplicates merged,
    sorted (a stable order whatever the server's rotation), at most ``limit``.
    No usable record at all: ``DnsFault(EMPTY)`` (an empty set never replaces a known
    one: docs/design.md §11.3). Each address is parsed once (hundreds per answer, every
    refresh: docs/design.md §11.2)."""
    kept: dict[tuple[int, bytes, int], EndpointSpec] = {}
    dropped: list[str] = []
    ttl: int | None = None
    for record in records:
        try:
            address = ipaddress.ip_address(record.ip)
        except ValueError:
            _drop(dropped, record, "not an IP address")
            continue
        problem = _unusable(address)
        if problem is not None:
            _drop(dropped, record, problem)
            continue
        order = (address.version, address.packed, record.port)
        if order not in kept:
            canonical = str(address)
            text = endpoint_address(canonical, record.port)
            kept[order] = EndpointSpec(text, canonical, record.port, weight)
        ttl = record.ttl if ttl is None else min(ttl, record.ttl)
    if not kept:
        reason = "no usable address" + (f" ({'; '.join(dropped)})" if dropped else "")
        raise DnsFault(FaultKind.EMPTY, reason)
    ordered = [kept[k] for k in sorted(kept)]
    if len(ordered) > limit:
        dropped.append(f"{len(ordered) - limit} addresses over max_endpoints {limit}")
        ordered = ordered[:limit]
    return Found(tuple(ordered), ttl or 0, tuple(dropped))


def _drop(dropped: list[str], record: Record, problem: str) -> None:
    if len(dropped) < 5:  # a hostile answer must not make an unbounded log line
        dropped.append(f"{printable_line(record.ip, 50)}: {problem}")


def next_refresh(refresh_s: float, ttl: int, cost_s: float = 0.0) -> float:
    """Seconds until the next resolution: the TTL, but never sooner than ``refresh_s``
    (the floor) and never later than ``max(refresh_s, MAX_TTL_WAIT_S)``; and never sooner
    than COST_FACTOR times ``cost_s``, the CPU the last resolution took."""
    paced = max(refresh_s, min(float(max(ttl, 0)), MAX_TTL_WAIT_S))
    return max(paced, COST_FACTOR * cost_s)


def backoff_cap(refresh_s: float) -> float:
    """The longest wait between two attempts while resolution fails: a few refreshes,
    at most 30 s (DNS back within a minute is seen within 30 s)."""
    return min(max(refresh_s * 4, 5.0), 30.0)
