"""The one bearer-token check every authenticated surface uses (``server.token`` on the
gRPC port, ``admin.token`` on the admin API; docs/design.md §7.10).

The presented value is compared with ``hmac.compare_digest`` (time independent of where
the first difference lies), against the whole ``Bearer <token>`` header value, so a
prefix never passes and the token's length is the only thing timing can tell.

Refused calls are logged at most once per peer host per ``REFUSED_LOG_EVERY_S``
(``core.problems``; docs/design.md §10): a caller with a wrong token cannot write a line
per call. Every refusal is still counted by the surface that refused it.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Iterable

from llm_health.core.problems import ProblemLog

HEADER = "authorization"  # gRPC metadata keys are lower case
REFUSED_LOG_EVERY_S = 60.0  # quiet time of a peer host's "refused" log line
REFUSING_PEERS = 1024  # peer hosts remembered for that quiet time: bounded memory


def expected_value(token: str) -> bytes:
    """What a caller must send in ``authorization``."""
    if not token:
        raise ValueError("empty token")
    return f"Bearer {token}".encode()


def presented_value(metadata: Iterable[tuple[str, str | bytes]] | None) -> bytes:
    """The first ``authorization`` value in gRPC metadata (bytes; empty when absent)."""
    for key, value in metadata or ():
        if key == HEADER:
            return value if isinstance(value, bytes) else str(value).encode()
    return b""


def bearer_matches(metadata: Iterable[tuple[str, str | bytes]] | None, expected: bytes) -> bool:
    """Whether ``metadata`` carries exactly ``expected`` (``expected_value(token)``)."""
    return hmac.compare_digest(presented_value(metadata), expected)


def refusal_log(log: logging.Logger, clock: Callable[[], float] = time.monotonic) -> ProblemLog:
    """The log of refused calls, keyed by ``core.problems.peer_host``: one line per peer
    host per ``REFUSED_LOG_EVERY_S``, at most ``REFUSING_PEERS`` hosts held."""
    return ProblemLog(log, every_s=REFUSED_LOG_EVERY_S, max_keys=REFUSING_PEERS, clock=clock)
