"""Who probes which endpoint: rendezvous (highest-random-weight) hashing of the endpoint
key over the live members. A member joining or leaving moves only the endpoints it wins
or held (about 1/N of them); every replica computes the same owner from the same member
list, and so does the publish script in Redis (``scripts.PUBLISH``), which uses the same
hash: SHA-1 of ``member + "\\n" + key``, highest hex digest wins, ties by member id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from llm_health.model.states import EndpointKey


def endpoint_key(cluster: str, address: str) -> str:
    """The key of an endpoint in Redis ("|" is in neither cluster names nor addresses)."""
    return f"{cluster}|{address}"


def split_key(key: str) -> EndpointKey:
    cluster, sep, address = key.partition("|")
    if not sep:
        raise ValueError(f"not an endpoint key: {key[:80]!r}")
    return cluster, address


def score(member: str, key: str) -> str:
    return hashlib.sha1(f"{member}\n{key}".encode(), usedforsecurity=False).hexdigest()


def owner_of(key: str, members: Iterable[str]) -> str | None:
    """The member that owns ``key`` (None: no member)."""
    best: tuple[str, str] | None = None
    for member in members:
        candidate = (score(member, key), member)
        if best is None or candidate > best:
            best = candidate
    return None if best is None else best[1]
