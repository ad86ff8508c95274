"""One cluster's discovery loop: resolve, hand a changed set on, sleep, again.

A failed resolution (``DnsFault``) keeps the last known set and is retried with
exponential back-off and jitter (tenacity) until one succeeds; the first failure of a
streak is logged and reported once (``on_fault(cluster, fault)``), the recovery once
(``on_fault(cluster, None)``), the attempts between them only counted: a DNS server that
stays down cannot make us log without bound. Records left out of an answer are logged
when they change, at most once a minute (``core.problems.ProblemLog``): nor can a server
whose answers change at every refresh.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential,
    wait_random,
)

from llm_health.core.problems import ProblemLog
from llm_health.discovery.answers import DnsFault, FaultKind, Found, backoff_cap, next_refresh
from llm_health.discovery.settings import DiscoveryConfig
from llm_health.model.board import EndpointSpec

Resolve = Callable[[DiscoveryConfig], Awaitable[Found]]
OnFound = Callable[[str, tuple[EndpointSpec, ...]], Awaitable[None]]  # (cluster, set)
OnFault = Callable[[str, DnsFault | None], None]  # (cluster, fault; None = recovered)
log = logging.getLogger("llm_health")


@dataclass(slots=True)
class WatchStats:
    """What /status and /metrics show of one cluster's discovery."""

    endpoints: int = 0  # in the last good set
    resolutions: int = 0  # successful
    failures: int = 0  # failed attempts (every one, not only the first of a streak)
    changes: int = 0  # times the set changed
    failing_since: float | None = None  # wall time of the streak's first failure
    last_fault: DnsFault | None = None
    last_success: float | None = None  # wall time
    dropped: tuple[str, ...] = ()


class Watcher:
    """Resolves ``settings.name`` every ``next_refresh`` seconds; calls ``on_found`` with
    ``cluster``'s discovered set each time it differs from the last one handed on."""

    def __init__(
        self,
        cluster: str,
        settings: DiscoveryConfig,
        resolve: Resolve,
        on_found: OnFound,
        on_fault: OnFault,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.stats = WatchStats()
        self._resolve = resolve
        self._on_found = on_found
        self._on_fault = on_fault
        self._wall_clock = wall_clock
        self._current: tuple[EndpointSpec, ...] | None = None
        self._left_out = ProblemLog(log)

    @property
    def current(self) -> tuple[EndpointSpec, ...] | None:
        """The last set handed on (None: no successful resolution yet)."""
        return self._current

    async def run(self) -> None:
        while True:
            found = await self.resolve_once()
            await asyncio.sleep(next_refresh(self.settings.refresh, found.ttl, found.cost_s))

    async def resolve_once(self) -> Found:
        """Resolve until an answer is usable (back-off between attempts), take it."""
        refresh = self.settings.refresh
        initial = min(refresh, 1.0)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(DnsFault),
            wait=wait_exponential(multiplier=initial, max=backoff_cap(refresh))
            + wait_random(0, initial),  # jitter: replicas do not retry in step
            before_sleep=self._failed,
            reraise=True,
        )
        found: Found = await retrying(self._attempt)
        await self._take(found)
        return found

    async def _attempt(self) -> Found:
        try:
            return await self._resolve(self.settings)
        except DnsFault:
            raise
        except Exception as exc:  # a resolver bug must not end discovery (or the service)
            log.debug("discovery: resolver error", exc_info=True)
            raise DnsFault(FaultKind.BAD_ANSWER, f"resolver error: {type(exc).__name__}") from None

    def _failed(self, state: RetryCallState) -> None:
        fault = state.outcome.exception() if state.outcome is not None else None
        if not isinstance(fault, DnsFault):
            return
        self.stats.failures += 1
        self.stats.last_fault = fault
        if self.stats.failing_since is not None:
            return  # one log line and one report per streak
        self.stats.failing_since = self._wall_clock()
        log.warning(
            "DNS discovery failed; keeping the last known endpoints",
            extra={**self._fields(), "fault": fault.kind.value, "reason": fault.reason},
        )
        self._on_fault(self.cluster, fault)

    async def _take(self, found: Found) -> None:
        stats = self.stats
        stats.resolutions += 1
        stats.last_success = self._wall_clock()
        if stats.failing_since is not None:
            stats.failing_since = None
            log.info("DNS discovery recovered", extra=self._fields())
            self._on_fault(self.cluster, None)
        if found.dropped and found.dropped != stats.dropped:
            self._left_out.report(
                "left out",
                "DNS discovery: records left out",
                {**self._fields(), "dropped": found.dropped},
            )
        stats.dropped = found.dropped
        if found.endpoints == self._current:
            return
        stats.changes += 1 if self._current is not None else 0
        stats.endpoints = len(found.endpoints)
        self._current = found.endpoints
        await self._on_found(self.cluster, found.endpoints)

    def _fields(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "dns_name": self.settings.name,  # "name" is a LogRecord attribute
            "kind": self.settings.kind,
            "endpoints": self.stats.endpoints,
        }

    def status(self, now_wall: float) -> dict[str, Any]:
        """/status: this cluster's discovery, JSON-ready."""
        stats = self.stats
        fault = stats.last_fault
        return {
            "name": self.settings.name,
            "kind": self.settings.kind,
            "endpoints": stats.endpoints,
            "resolutions": stats.resolutions,
            "failures": stats.failures,
            "changes": stats.changes,
            "failing": stats.failing_since is not None,
            "failing_for_s": _age(stats.failing_since, now_wall),
            "last_fault": None
            if fault is None
            else {"kind": fault.kind.value, "reason": fault.reason},
            "last_success_age_s": _age(stats.last_success, now_wall),
            "dropped": list(stats.dropped),
        }


def _age(since: float | None, now: float) -> float | None:
    return None if since is None else round(max(0.0, now - since), 3)
