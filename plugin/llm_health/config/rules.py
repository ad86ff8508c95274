"""The rules across fields and sections of the serve file (docs/design.md §6), in one place.

Each rule is a small pure function over plain values: it returns the problem it finds
(None: none), or yields ``(path, message)`` problems whose path names the field. The
models of ``config/schema.py`` raise a rule's problem from their validators (so a model
built in code is held to it too); ``config/loader.py`` runs the rules over the raw
mapping (``counts``, before pydantic) and over the validated file (``duplicates``,
``merged_probes``). A new rule goes here, and nowhere else.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from llm_health.core.addresses import is_local_bind

MAX_WEIGHT_SUM = 4_294_967_295  # Envoy: per-locality weight sum must fit in uint32
MAX_CLUSTERS = 2_000  # per file (docs/configuration.md "Limits")
MAX_ENDPOINTS = 50_000  # per file, over every cluster

# Where in the file (keys and list indexes from the top, ``config.messages.ConfigPath``),
# and what is wrong.
Problem = tuple[tuple[str | int, ...], str]


# --- probe ------------------------------------------------------------------------------


def ttft_within_timeout(healthy_ttft_s: float, timeout_s: float) -> str | None:
    """``probe.healthy_ttft`` < ``probe.timeout`` (a probe cannot be fast after it timed
    out), checked on the top level and on each cluster's merged settings."""
    if healthy_ttft_s >= timeout_s:
        return "healthy_ttft must be shorter than timeout"
    return None


def merged_probes(
    merges: Iterable[Callable[[], object]], describe: Callable[[ErrorDetails], str]
) -> Iterator[Problem]:
    """Each cluster's ``probe`` overrides merged over the top level's validate (e.g.
    ``ttft_within_timeout``): ``merges[i]`` builds ``clusters[i]``'s effective settings;
    ``describe`` words pydantic's errors as the loader does."""
    for index, merge in enumerate(merges):
        try:
            merge()
        except ValidationError as exc:
            for error in exc.errors():
                yield ("clusters", index, "probe", *error["loc"]), describe(error)


# --- clusters ---------------------------------------------------------------------------


def endpoints_or_discovery(cluster: str, endpoints: int, discovery: bool) -> str | None:
    """A cluster gives ``endpoints``, ``discovery``, or both."""
    if not endpoints and not discovery:
        return f"cluster {cluster}: give endpoints, discovery, or both"
    return None


def weights_fit(weights: Iterable[int]) -> str | None:
    """``clusters[].endpoints[].weight`` add up within Envoy's uint32 (per locality)."""
    if sum(weights) > MAX_WEIGHT_SUM:
        return "the sum of endpoint weights exceeds Envoy's uint32 limit"
    return None


def endpoints_total(total: int) -> str | None:
    """At most MAX_ENDPOINTS endpoints over every cluster of the file."""
    if total > MAX_ENDPOINTS:
        return f"{total} endpoints in all; at most {MAX_ENDPOINTS} are allowed"
    return None


def counts(raw: dict[Any, Any]) -> Iterator[Problem]:
    """The cluster and endpoint limits, checked on the raw mapping before pydantic sees
    a huge file."""
    clusters = raw.get("clusters")
    if not isinstance(clusters, list):
        return
    if len(clusters) > MAX_CLUSTERS:
        yield ("clusters",), f"{len(clusters)} clusters; at most {MAX_CLUSTERS} are allowed"
        return
    total = sum(
        len(c["endpoints"])
        for c in clusters
        if isinstance(c, dict) and isinstance(c.get("endpoints"), list)
    )
    problem = endpoints_total(total)
    if problem is not None:
        yield ("clusters",), problem


def duplicates(clusters: Iterable[tuple[str, Iterable[str]]]) -> Iterator[Problem]:
    """Duplicate cluster names, and endpoints that are the same host:port however written
    ("[::1]:80" and "[0::1]:80" are one endpoint). ``clusters``: (name, addresses) of
    each cluster, in the file's order."""
    names: set[str] = set()
    for i, (name, addresses) in enumerate(clusters):
        if name in names:
            yield ("clusters", i, "name"), f'duplicate cluster name "{name}"'
        names.add(name)
        seen: set[tuple[str, int]] = set()
        for j, address in enumerate(addresses):
            key = _canonical(address)
            if key in seen:
                yield ("clusters", i, "endpoints", j, "address"), f'duplicate endpoint "{address}"'
            seen.add(key)


def _canonical(address: str) -> tuple[str, int]:
    """A validated address in one spelling. An IPv4 literal has one already (leading
    zeros are refused); only IPv6 needs parsing ("[0::1]" is "[::1]")."""
    host, _, port = address.rpartition(":")
    if host.startswith("["):
        return str(ipaddress.IPv6Address(host[1:-1])), int(port)
    return host.lower().rstrip("."), int(port)


# --- server -----------------------------------------------------------------------------


def server_reachable(grpc: str, http: str, authz: str | None, authenticated: bool) -> str | None:
    """``server``: its own admission port apart from the others, and no port off loopback
    without ``server.token`` or mutual TLS (``authenticated``)."""
    return (
        _authz_apart(grpc, http, authz)
        or _authz_authenticated(authz, authenticated)
        or _grpc_authenticated(grpc, authenticated)
    )


def _authz_apart(grpc: str, http: str, authz: str | None) -> str | None:
    if authz is not None and authz in (grpc, http):
        return f'authz "{authz}" must differ from grpc and http'
    return None


def _authz_authenticated(authz: str | None, authenticated: bool) -> str | None:
    if not authenticated and authz and not is_local_bind(authz):
        return (
            f'authz "{authz}" is not a loopback address or Unix socket: set '
            "server.token or server.tls.client_ca (mutual TLS); otherwise anyone "
            "reaching the port can read every cluster's admission state"
        )
    return None


def _grpc_authenticated(grpc: str, authenticated: bool) -> str | None:
    if not authenticated and not is_local_bind(grpc):
        return (
            f'grpc "{grpc}" is not a loopback address or Unix socket: set '
            'server.token (e.g. token: "${LLM_HEALTH_TOKEN}", sent by Envoy as '
            "initial_metadata) or server.tls.client_ca (mutual TLS); otherwise anyone "
            "reaching the port can eject endpoints through HDS"
        )
    return None
