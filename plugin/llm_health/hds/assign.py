"""Which connected Envoys check which endpoint: rendezvous (highest random weight) hashing.

Each (endpoint, node) pair gets a score from a hash; an endpoint is checked by the
``count`` nodes with the highest scores. Properties that follow (and are tested):

- even: every node wins about ``count / len(nodes)`` of the endpoints;
- stable: a node joining takes over only endpoints it now ranks in the top ``count`` for;
  a node leaving hands only its own endpoints to the next-ranked nodes; nothing else moves;
- deterministic: the same endpoints and nodes give the same assignment in every process.

Pure functions; no I/O.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from llm_health.model.states import EndpointKey

"""(cluster name, endpoint address as written in the config)."""


MAX_PLAIN_NODE_ID = 256  # longer node ids are scored by their digest (see node_part)


def score(endpoint: EndpointKey, node: str) -> int:
    """The pair's weight: 64 bits of BLAKE2b over cluster, address and node id."""
    cluster, address = endpoint
    data = f"{cluster}\x00{address}\x00".encode() + node_part(node)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=4096)
def node_part(node: str) -> bytes:
    """What of a node id goes into its scores: the id itself, or for an id longer than
    MAX_PLAIN_NODE_ID (the peer's text: it may send a megabyte) its digest, computed once.
    Every (endpoint, node) pair is scored on each reassignment: hashing a 1 MB id per pair
    took minutes for 1,000 endpoints and 30 such nodes, on the event loop."""
    if len(node) <= MAX_PLAIN_NODE_ID:
        return node.encode()
    return b"#" + hashlib.blake2b(node.encode(), digest_size=32).digest()


def checkers(endpoint: EndpointKey, nodes: Iterable[str], count: int) -> tuple[str, ...]:
    """The ``count`` best-scoring nodes for ``endpoint``, best first (ties: by node id)."""
    ranked = heapq.nlargest(count, nodes, key=lambda node: (score(endpoint, node), node))
    return tuple(ranked)


@dataclass(frozen=True, slots=True)
class Assignment:
    """``by_endpoint``: endpoint -> its checkers (best first); every endpoint is present,
    with ``()`` when no node is available. ``by_node``: node -> its endpoints, sorted."""

    by_endpoint: Mapping[EndpointKey, tuple[str, ...]]
    by_node: Mapping[str, tuple[EndpointKey, ...]]

    def endpoints_of(self, node: str) -> tuple[EndpointKey, ...]:
        return self.by_node.get(node, ())

    def checkers_of(self, endpoint: EndpointKey) -> tuple[str, ...]:
        return self.by_endpoint.get(endpoint, ())


EMPTY = Assignment(MappingProxyType({}), MappingProxyType({}))


def assign(endpoints: Iterable[EndpointKey], nodes: Iterable[str], count: int) -> Assignment:
    """Give every endpoint ``min(count, len(nodes))`` checkers. ``count`` must be >= 1."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    pool = sorted(set(nodes))
    by_endpoint = {e: checkers(e, pool, count) for e in sorted(set(endpoints))}
    by_node: dict[str, list[EndpointKey]] = {node: [] for node in pool}
    for endpoint, chosen in by_endpoint.items():
        for node in chosen:
            by_node[node].append(endpoint)
    return Assignment(
        MappingProxyType(by_endpoint),
        MappingProxyType({node: tuple(found) for node, found in by_node.items()}),
    )
