"""The prober's pieces that ``serve`` (``app.runtime``) and ``llm-health agent``
(``app.agent``) share: the per-endpoint probe slots, the scheduler folding into the
keeper's board, how late the prober runs, and the port an HTTP server bound."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from aiohttp import web

from llm_health.app.keeper import BoardKeeper
from llm_health.core.control import ProberStats
from llm_health.model.outcome import ProbeResult
from llm_health.probe.client import ProbeFn
from llm_health.probe.scheduler import ResultFn, Scheduler, SilenceFn
from llm_health.probe.target import ProbeTarget


def probe_scheduler(
    control: BoardKeeper,
    targets: Sequence[ProbeTarget],
    slots: ProbeSlots,
    *,
    on_result: ResultFn | None = None,
    on_silence: SilenceFn | None = None,
    skip: Callable[[ProbeTarget], bool] | None = None,
) -> Scheduler:
    """A scheduler probing through ``slots`` whose results and in-flight silences fold
    into the keeper's board (unless ``on_result`` / ``on_silence`` say otherwise), with
    the confirming probe beside a silent one (docs/design.md §2.7)."""

    async def fold(target: ProbeTarget, result: ProbeResult) -> None:
        await control.fold_probe(target.cluster, target.address, result)

    async def silence(target: ProbeTarget, silent_ms: float) -> bool:
        return await control.fold_silence(target.cluster, target.address, silent_ms)

    async def confirm(target: ProbeTarget) -> ProbeResult:
        control.stats.overlapping_confirms += 1
        return await slots.confirm(target)

    return Scheduler(
        targets,
        slots.probe,
        on_result or fold,
        on_silence=on_silence or silence,
        confirm=confirm,
        lag=ProberLag(control.stats),
        skip=skip,
    )


class ProberLag:
    """How late the prober runs, for the scheduler's silence checks: the runtime's loop,
    or a probe worker's (``ProberStats.lag_now_ms``)."""

    def __init__(self, stats: ProberStats) -> None:
        self._stats = stats

    @property
    def current_ms(self) -> float:
        return self._stats.lag_now_ms()


class ProbeSlots:
    """At most one probe in flight per endpoint through ``probe`` (scheduled probes and
    probe-now share it), plus at most one through ``confirm``: the confirming probe
    started beside a silent one. Never more than two (docs/design.md §2.7). An
    uncontended asyncio.Lock does not yield: no added latency."""

    def __init__(self, probe: ProbeFn) -> None:
        self._probe = probe
        self._main: dict[str, asyncio.Lock] = {}
        self._extra: dict[str, asyncio.Lock] = {}

    async def probe(self, target: ProbeTarget) -> ProbeResult:
        async with _slot(self._main, target.key):
            return await self._probe(target)

    async def confirm(self, target: ProbeTarget) -> ProbeResult:
        async with _slot(self._extra, target.key):
            return await self._probe(target)


def _slot(locks: dict[str, asyncio.Lock], key: str) -> asyncio.Lock:
    """The endpoint's lock, made at its first probe (not a new one thrown away at every
    probe, as ``setdefault(key, asyncio.Lock())`` would)."""
    lock = locks.get(key)
    if lock is None:
        lock = locks[key] = asyncio.Lock()
    return lock


def bound_port(runner: web.AppRunner) -> int | None:
    """The TCP port a started HTTP server listens on (None: a Unix socket)."""
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return None
