"""The runtime's side of the admission process (``server.authz_isolation: process``,
docs/design.md §16.9): start it, feed it the health view, take its counters, restart it.

- The view crosses as ``ClusterFacts`` (per cluster: name, warm, capacity), not the
  snapshot: a few numbers per cluster, sent when they or the ``authz:`` settings change
  (checked on every publish and every ``SETTINGS_POLL_S`` for a reload).
- Its counters come back every COUNTERS_EVERY_S (``reports`` in /status counts them); a
  process that ends has its last counts added to a base, so the totals never go down.
  Its token rejections are added to ``grpc_auth``'s.
- It is restarted when it exits, after RESTART_MIN_S doubling to RESTART_MAX_S (back to
  the minimum once it served HEALTHY_LIFE_S), and killed first when it stops reading its
  pipe (more than MAX_UNREAD_BYTES queued) or stops reporting (SILENT_S).
- Until it serves, Envoy's checks to its port fail, and the filter's
  ``failure_mode_allow`` decides (docs/design.md §7.7).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from llm_health.authz import AuthzConfig, AuthzCounters, ClusterFacts, CountersState, cluster_facts
from llm_health.authz.component.pipe import MODULE, ChildInit
from llm_health.core.control import SnapshotSource
from llm_health.ops.logging_setup import current_logging
from llm_health.probe.loop import child_env
from llm_health.probe.wire import FrameError, Message, Outbox, read_messages
from llm_health.servers.auth import SecurityProvider
from llm_health.servers.grpc import GrpcAuthStats

log = logging.getLogger("llm_health.authz")
READ_CHUNK = 256 * 1024
SETTINGS_POLL_S = 1.0
RESTART_MIN_S = 0.5
RESTART_MAX_S = 30.0
HEALTHY_LIFE_S = 60.0
READY_S = 15.0  # from start to serving
SILENT_S = 10.0  # without a counters report, once serving (it reports 4 times a second)
WATCH_S = 1.0
MAX_UNREAD_BYTES = 4 * 1024 * 1024
STOP_GRACE_S = 3.0

_Sent = tuple[tuple[ClusterFacts, ...], AuthzConfig]


class AdmissionProcess:
    def __init__(
        self,
        listen: str,
        published: SnapshotSource,
        settings: Callable[[], AuthzConfig],
        security: SecurityProvider,
        auth_stats: GrpcAuthStats | None = None,
    ) -> None:
        self.listen = listen
        self._published, self._settings, self._security = published, settings, security
        self._auth_stats = auth_stats
        self.port: int | None = None  # while serving (0: a Unix socket)
        self.pid: int | None = None
        self.restarts = 0
        self.reports = 0  # counter reports taken, from every process
        self.error = ""
        self._base = AuthzCounters()
        self._latest = CountersState()
        self._base_rebuilds = self._rebuilds = self._rejected = 0
        self._heard = 0.0
        self._sent: _Sent | None = None
        self._seen: tuple[int, AuthzConfig] | None = None  # revision and settings looked at

    # --- what the component shows ---------------------------------------------------------

    def counters(self) -> AuthzCounters:
        """Every check answered since start, across restarts."""
        total = AuthzCounters()
        total.add(self._base.state())
        total.add(self._latest)
        return total

    @property
    def rebuilds(self) -> int:
        return self._base_rebuilds + self._rebuilds

    def status(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "listen": self.listen,
            "isolation": "process",
            "serving": self.port is not None,
            "pid": self.pid,
            "restarts": self.restarts,
            "reports": self.reports,
        }
        if self.error:
            shown["error"] = self.error
        return shown

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the process running until cancelled."""
        delay = RESTART_MIN_S
        while True:
            started = time.monotonic()
            try:
                await self._life()
            except OSError as exc:  # could not start it at all, or read its TLS files
                self.error = f"admission process not started: {exc}"[:300]
                log.error("admission process not started", extra={"error": self.error})
            if time.monotonic() - started >= HEALTHY_LIFE_S:
                delay = RESTART_MIN_S
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX_S)
            self.restarts += 1

    async def _life(self) -> None:
        """One process, from start to exit (or to cancellation, which stops it)."""
        secrets = self._security().secrets  # reads the TLS files: before anything starts
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            MODULE,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=child_env(),
        )
        assert process.stdin is not None and process.stdout is not None
        self.pid, self._heard = process.pid, time.monotonic()
        self._sent = self._seen = None
        pipe = Outbox(process.stdin.write)
        fmt, level = current_logging()
        pipe.put(("init", ChildInit(self.listen, secrets, fmt, level)))
        reader = asyncio.create_task(self._read(process.stdout))
        feeder = asyncio.create_task(self._feed(pipe))
        stopping = False
        try:
            await self._watch(process)
        except asyncio.CancelledError:
            stopping = True  # the service stops: so does the process, and that is no news
            raise
        finally:
            feeder.cancel()
            await _stop(process)
            with contextlib.suppress(asyncio.CancelledError):
                await reader  # the last counters it wrote on its way out
            self._ended(process.returncode, stopping)

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        """Wait for the process to exit; kill it when it is stuck."""
        exited = asyncio.ensure_future(process.wait())
        try:
            while not exited.done():
                await asyncio.wait({exited}, timeout=WATCH_S)
                stuck = self._stuck(process)
                if stuck and not exited.done():
                    log.error("admission process stuck: killing it", extra={"why": stuck})
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
        finally:
            exited.cancel()

    def _stuck(self, process: asyncio.subprocess.Process) -> str:
        assert process.stdin is not None
        unread = process.stdin.transport.get_write_buffer_size()
        if unread > MAX_UNREAD_BYTES:
            return f"{unread} bytes it does not read"
        silent = time.monotonic() - self._heard
        if self.port is None and silent > READY_S:
            return f"not serving after {silent:.0f} s"
        if self.port is not None and silent > SILENT_S:
            return f"no report for {silent:.0f} s"
        return ""

    def _ended(self, returncode: int | None, stopping: bool) -> None:
        served = self.port is not None and not stopping
        self._base.add(self._latest)
        self._base_rebuilds += self._rebuilds
        self._latest, self._rebuilds, self._rejected = CountersState(), 0, 0
        self.port = self.pid = None
        if served:
            log.warning("admission process exited", extra={"returncode": returncode})

    # --- the pipe -------------------------------------------------------------------------

    async def _feed(self, pipe: Outbox) -> None:
        revision = self.send_view(pipe)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._published.wait_newer(revision), SETTINGS_POLL_S)
            revision = self.send_view(pipe)

    def send_view(self, pipe: Outbox) -> int:
        """Send the view when its facts or the settings changed; the revision seen (what
        the pipe's feeder does on every publish and poll, ``take``'s other half). The
        facts are worked out only for a new snapshot or settings (the poll that looks for
        a reload mostly finds neither)."""
        snapshot, settings = self._published.current(), self._settings()
        seen = self._seen
        if seen is not None and seen[0] == snapshot.revision and seen[1] is settings:
            return snapshot.revision
        self._seen = (snapshot.revision, settings)
        facts = cluster_facts(snapshot)
        if self._sent is None or self._sent != (facts, settings):
            pipe.put(("view", snapshot.revision, facts, settings))
            self._sent = (facts, settings)
        return snapshot.revision

    async def _read(self, stream: asyncio.StreamReader) -> None:
        try:
            async for message in read_messages(stream, READ_CHUNK):
                self.take(message)
        except FrameError as exc:
            log.error("admission process wrote garbage", extra={"error": str(exc)[:200]})

    def take(self, message: Message) -> None:
        self._heard = time.monotonic()
        kind = message[0]
        if kind == "counters":
            self.reports += 1
            _, self._latest, self._rebuilds, rejected = message
            if self._auth_stats is not None:
                self._auth_stats.rejected_total += max(0, rejected - self._rejected)
            self._rejected = rejected
        elif kind == "ready":
            self.port, self.error = message[1], ""
            log.info("ext_authz serving in its own process", extra={"listen": self.listen})
        elif kind == "failed":
            self.error = str(message[1])[:300]
            log.error("ext_authz process cannot serve", extra={"error": self.error})


async def _stop(process: asyncio.subprocess.Process) -> None:
    """Close its stdin (it stops on that), then kill it if it has not within the grace."""
    if process.returncode is not None:
        return
    if process.stdin is not None:
        process.stdin.close()
    try:
        await asyncio.wait_for(asyncio.shield(process.wait()), STOP_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
