"""The ``remediation`` component: runs the hooks of ``remediation:`` within ``limits:``
(docs/design.md §13; the rules are ``remediation.decide``, the settings
``remediation.settings``).

Every second it looks at the board (through ``BoardControl``: the snapshot, each
endpoint's first sight, each cluster's policy); for each endpoint a hook is due for and the limits let
through, it runs the argv (no shell: ``asyncio.create_subprocess_exec``, its own process
group, stdin closed, output captured up to MAX_OUTPUT bytes) or POSTs the webhook, and
kills / gives up at ``timeout``. In fleet mode only the endpoint's owner acts (the
replica that probes it): one restart, not one per gateway replica.

Every run is audited: a log line when it starts and one with its outcome, counters in
/status and /metrics, the last RECENT runs in /status, and a ``remediation`` alert.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
import grpc
from prometheus_client.metrics_core import Metric

from llm_health.core.component import Job
from llm_health.core.control import BoardControl, Notice
from llm_health.core.families import counter, gauge
from llm_health.model.board import HealthSnapshot
from llm_health.model.redact import printable_line
from llm_health.remediation.decide import Candidate, Ledger, is_due, refusal
from llm_health.remediation.settings import LimitsConfig, RemediationConfig
from llm_health.remediation.template import render

TICK_S = 1.0
MAX_OUTPUT = 4096  # bytes of a hook's output kept for the audit
RECENT = 20
log = logging.getLogger("llm_health")
Responsible = Callable[[str, str], bool]  # does this replica act for the endpoint


@dataclass(slots=True)
class RemediationCounters:
    """Hooks run, and how they ended (/status shows them by these names)."""

    runs_total: int = 0
    dry_runs_total: int = 0  # limits.dry_run: due, allowed, not run
    succeeded_total: int = 0
    failed_total: int = 0
    killed_total: int = 0  # at the rule's timeout
    refused_total: int = 0  # by a limit (cooldowns and hooks still running aside)


class RemediationComponent:
    name = "remediation"

    def __init__(
        self,
        rules: tuple[RemediationConfig, ...],
        limits: LimitsConfig,
        control: BoardControl,
        *,
        responsible: Responsible = lambda _c, _a: True,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        tick_s: float = TICK_S,
    ) -> None:
        self.rules, self.limits = rules, limits
        self._control = control
        self._responsible = responsible
        self._clock, self._wall_clock = clock, wall_clock
        self._tick_s = tick_s
        self.ledger = Ledger()
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.counters = RemediationCounters()
        self._tasks: set[asyncio.Task[None]] = set()

    # --- Component protocol -------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        """No gRPC service."""

    def tasks(self) -> list[Job]:
        return [self._ticker] if self.rules else []

    def status(self) -> dict[str, Any]:
        return {
            "rules": len(self.rules),
            "dry_run": self.limits.dry_run,
            "running": len(self.ledger.running),
            **asdict(self.counters),
            "recent": list(self.recent),
        }

    def metrics(self) -> Iterator[Metric]:
        counters = self.counters
        yield gauge(
            "llm_health_remediation_rules", "Rules configured (remediation:).", len(self.rules)
        )
        yield gauge(
            "llm_health_remediation_dry_run",
            "1 while hooks are only logged, not run (limits.dry_run).",
            self.limits.dry_run,
        )
        yield gauge(
            "llm_health_remediation_running", "Hooks running now.", len(self.ledger.running)
        )
        yield counter("llm_health_remediation_runs_total", "Hooks started.", counters.runs_total)
        yield counter(
            "llm_health_remediation_dry_runs_total",
            "Hooks due and allowed but not run (limits.dry_run).",
            counters.dry_runs_total,
        )
        yield counter(
            "llm_health_remediation_succeeded_total",
            "Hooks that ended well (exit 0, or a 2xx webhook answer).",
            counters.succeeded_total,
        )
        yield counter(
            "llm_health_remediation_failed_total",
            "Hooks that failed (another exit code or answer, or an error).",
            counters.failed_total,
        )
        yield counter(
            "llm_health_remediation_killed_total",
            "Hooks killed or given up on at their timeout.",
            counters.killed_total,
        )
        yield counter(
            "llm_health_remediation_refused_total",
            "Due hooks refused by a limit (limits:).",
            counters.refused_total,
        )

    # --- deciding -----------------------------------------------------------------------

    async def _ticker(self) -> None:
        try:
            while True:
                await asyncio.sleep(self._tick_s)
                self.tick(self._control.snapshot())
        finally:
            for task in self._tasks:
                task.cancel()

    def tick(self, snapshot: HealthSnapshot) -> list[tuple[Candidate, RemediationConfig]]:
        """Start every hook that is due and allowed now; returns what was started."""
        now, wall_now = self._clock(), self._wall_clock()
        self.ledger.forget_before(now)
        started = []
        for candidate in self._candidates(snapshot, now, wall_now):
            for rule in self.rules:
                if not is_due(rule, candidate):
                    continue
                why = refusal(self.ledger, candidate, rule, self.limits, now)
                if why is not None:
                    if why not in ("already running",) and not why.startswith("cooldown"):
                        self.counters.refused_total += 1
                    continue
                self.ledger.start(candidate.key, rule, now)
                task = asyncio.get_running_loop().create_task(self._run(candidate, rule))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                started.append((candidate, rule))
        return started

    def _candidates(self, snapshot: HealthSnapshot, now: float, wall_now: float) -> list[Candidate]:
        found = []
        for name, cluster in snapshot.clusters.items():
            size, policy = len(cluster.endpoints), self._control.policy(name)
            for endpoint in cluster.endpoints:
                address = endpoint.spec.address
                if endpoint.removing or not self._responsible(name, address):
                    continue
                first = self._control.first_seen(name, address)
                in_grace = first is None or now - first < policy.startup_grace_s
                found.append(
                    Candidate(
                        cluster=name,
                        address=address,
                        state=endpoint.state,
                        cause=endpoint.cause,
                        in_state_s=wall_now - endpoint.since,
                        in_grace=in_grace,
                        cluster_size=size,
                        max_ejection_percent=policy.max_ejection_percent,
                    )
                )
        return found

    # --- running ------------------------------------------------------------------------

    async def _run(self, candidate: Candidate, rule: RemediationConfig) -> None:
        key = candidate.key
        values = _values(candidate)
        what = " ".join(render(rule.run, values)) if rule.run else _origin(rule.webhook or "")
        entry: dict[str, Any] = {
            "cluster": candidate.cluster,
            "endpoint": candidate.address,
            "rule": rule.name,
            "action": printable_line(what, 300),
            "state": candidate.state.value,
            "cause": candidate.cause.value,
            "started": round(self._wall_clock(), 3),
        }
        try:
            if self.limits.dry_run:
                self.counters.dry_runs_total += 1
                entry["outcome"] = "dry run: not run"
            else:
                self.counters.runs_total += 1
                log.warning("remediation: running", extra=_fields(entry))
                entry.update(
                    await (self._exec(rule, values) if rule.run else self._post(rule, candidate))
                )
            self._count(entry["outcome"])
        except Exception as exc:  # a broken hook must never break the service
            entry["outcome"] = f"failed: {type(exc).__name__}"
            self.counters.failed_total += 1
        finally:
            self.ledger.finish(key, rule)
            entry["duration_s"] = round(self._wall_clock() - entry["started"], 3)
            self.recent.append(entry)
            log.warning("remediation: done", extra=_fields(entry))
            reason = f"{entry['rule']} for {candidate.address}: {entry['outcome']}"
            self._control.announce(Notice("remediation", candidate.cluster, reason))

    async def _exec(self, rule: RemediationConfig, values: dict[str, str]) -> dict[str, Any]:
        assert rule.run is not None
        argv = render(rule.run, values)
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group: a timeout kills its children too
        )
        try:
            async with asyncio.timeout(rule.timeout):
                output = await _bounded(process)
                code = await process.wait()
        except TimeoutError:
            _kill_group(process)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 5)
            return {"outcome": f"killed after {rule.timeout:g} s", "exit": None}
        text = printable_line(output.decode(errors="replace"), MAX_OUTPUT)
        return {"outcome": "ok" if code == 0 else f"exit {code}", "exit": code, "output": text}

    async def _post(self, rule: RemediationConfig, candidate: Candidate) -> dict[str, Any]:
        assert rule.webhook is not None
        body = {
            "source": "llm-health",
            "event": "remediation",
            "cluster": candidate.cluster,
            "endpoint": candidate.address,
            "state": candidate.state.value,
            "cause": candidate.cause.value,
            "for_s": round(candidate.in_state_s, 1),
            "rule": rule.name,
        }
        timeout = aiohttp.ClientTimeout(total=rule.timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(rule.webhook, json=body) as response,
            ):
                await response.content.read(MAX_OUTPUT)
                status = response.status
        except TimeoutError:
            return {"outcome": f"killed after {rule.timeout:g} s"}
        except aiohttp.ClientError as exc:
            return {"outcome": f"failed: {type(exc).__name__}"}
        return {"outcome": "ok" if 200 <= status < 300 else f"HTTP {status}", "status": status}

    def _count(self, outcome: str) -> None:
        if outcome == "ok":
            self.counters.succeeded_total += 1
        elif outcome.startswith("killed"):
            self.counters.killed_total += 1
        elif not outcome.startswith("dry run"):
            self.counters.failed_total += 1


async def _bounded(process: asyncio.subprocess.Process) -> bytes:
    """The first MAX_OUTPUT bytes of the output; the rest is read and dropped (a hook
    that writes without end must not fill our memory, nor block on a full pipe)."""
    assert process.stdout is not None
    kept = b""
    while chunk := await process.stdout.read(65536):
        if len(kept) < MAX_OUTPUT:
            kept += chunk[: MAX_OUTPUT - len(kept)]
    return kept


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _values(candidate: Candidate) -> dict[str, str]:
    host, _, port = candidate.address.rpartition(":")
    return {
        "cluster": candidate.cluster,
        "address": candidate.address,
        "host": host.strip("[]"),
        "port": port,
        "state": candidate.state.value,
        "cause": candidate.cause.value,
    }


def _origin(url: str) -> str:
    """scheme://host[:port] only: a webhook's path may carry a token."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _fields(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "output"}
