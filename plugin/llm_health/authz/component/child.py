"""The admission process (``server.authz_isolation: process``, docs/design.md §16.9):
``Authorization/Check`` on a grpc.aio server of its own, in an interpreter of its own.

Started by the runtime (``authz.component.process``) as ``python -m
llm_health.authz.component.child``, over its stdin/stdout pipes (the messages of
``authz.component.pipe``). It knows nothing of probes or the board. It binds only once
it has a view, so it never answers from nothing; each view replaces the last whole
(``PushedGate``). Its stdin closing (the runtime stopped, or died) stops it. The token
never appears in a log or a message it writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
from dataclasses import dataclass

import grpc

from llm_health.authz import PROBLEM_LOG_EVERY_S, AuthzCounters, PushedGate
from llm_health.authz.component.pipe import COUNTERS_EVERY_S, ChildInit
from llm_health.core.problems import ProblemLog
from llm_health.ops.logging_setup import setup_logging
from llm_health.probe.loop import WORKER_ENV
from llm_health.probe.loop import run as run_loop
from llm_health.probe.wire import Message, Outbox, open_pipes, read_messages
from llm_health.servers.auth import port_security
from llm_health.servers.authz import add_authz_servicer
from llm_health.servers.grpc import (
    GRPC_SERVER_OPTIONS,
    GrpcAuthStats,
    GrpcBindError,
    bind_grpc,
    create_grpc_server,
)

log = logging.getLogger("llm_health.authz")
READ_CHUNK = 1024 * 1024
STOP_GRACE_S = 1.0


@dataclass
class _Child:
    outbox: Outbox
    gate: PushedGate
    counters: AuthzCounters
    stats: GrpcAuthStats
    init: ChildInit | None = None
    server: grpc.aio.Server | None = None
    failed: bool = False

    def handle(self, message: Message) -> None:
        kind = message[0]
        if kind == "init" and self.init is None:
            self.init = message[1]
            setup_logging(self.init.log_format, self.init.log_level)
        elif kind == "view":
            _, revision, facts, settings = message
            self.gate.update(revision, facts, settings)
        else:
            log.error("admission process: unexpected message", extra={"kind": str(kind)[:40]})

    def report(self) -> None:
        state = self.counters.state()
        self.outbox.put(("counters", state, self.gate.rebuilds, self.stats.rejected_total))

    async def start(self) -> None:
        """Serve, once the init and a first view are in."""
        if self.server is not None or self.init is None or not self.gate.has_view:
            return
        security = port_security(self.init.secrets, self.stats)
        server = create_grpc_server(GRPC_SERVER_OPTIONS, interceptors=security.interceptors)
        problems = ProblemLog(log, every_s=PROBLEM_LOG_EVERY_S)
        add_authz_servicer(server, self.gate, self.counters, problems)
        try:
            port = bind_grpc(server, self.init.listen, security.credentials)
        except GrpcBindError as exc:
            self.failed = True
            self.outbox.put(("failed", str(exc)[:300]))
            return
        await server.start()
        self.server = server
        gc.collect()
        gc.freeze()  # start-up objects out of the collector's way (docs/design.md §16.4)
        self.outbox.put(("ready", port))


async def serve(read_fd: int, write_fd: int) -> int:
    reader, transport = await open_pipes(read_fd, write_fd, READ_CHUNK)
    child = _Child(Outbox(transport.write), PushedGate(), AuthzCounters(), GrpcAuthStats())
    reporter = asyncio.create_task(_report_every(child))
    try:
        async for message in read_messages(reader, READ_CHUNK):
            child.handle(message)
            await child.start()
            if child.failed:
                break
    finally:
        reporter.cancel()
        if child.server is not None:
            await child.server.stop(STOP_GRACE_S)
        child.report()
        child.outbox.flush()
        with contextlib.suppress(OSError):
            transport.close()
    return 1 if child.failed else 0


async def _report_every(child: _Child) -> None:
    while True:
        await asyncio.sleep(COUNTERS_EVERY_S)
        child.report()


def main() -> int:
    write_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print goes to stderr
    sys.stdout = sys.stderr
    read_fd = os.dup(sys.stdin.fileno())
    code = 0
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        code = run_loop(serve(read_fd, write_fd), os.environ.get(WORKER_ENV, "asyncio"))
    return code


if __name__ == "__main__":
    sys.exit(main())
