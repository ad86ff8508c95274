"""``llm-health serve --config FILE``: the plugin. SIGTERM/SIGINT stop it within 2 s,
whatever a worker thread is blocked on (docs/design.md §7.9)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_health.cli.commands import summary
from llm_health.cli.validate import load_or_report
from llm_health.ops.logging_setup import setup_logging
from llm_health.probe.loop import run as run_loop

if TYPE_CHECKING:
    from llm_health.app.runtime import Runtime

log = logging.getLogger("llm_health")
STOP_THREADS_S = 0.5  # what the exit waits for worker threads (the whole stop: under 2 s)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help=summary("serve"),
        description="Probe every configured endpoint and push health and weights to Envoy.",
    )
    parser.add_argument("--config", "-c", required=True, metavar="FILE")
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_format, args.log_level)
    config = load_or_report(args.config)
    if config is None:
        return 2
    from llm_health.app.assemble import build_runtime  # grpc and protos load only for `serve`

    try:
        run_loop(
            _serve(build_runtime(config, config_path=Path(args.config))), config.server.event_loop
        )
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return _exit_without_blocked_threads(0)


async def _serve(runtime: Runtime) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    workers = ThreadPoolExecutor(thread_name_prefix="asyncio")  # asyncio.to_thread's
    loop.set_default_executor(workers)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, runtime.request_reload)
    try:
        await runtime.run(stop)
    finally:
        # asyncio.run ends by joining the default executor's threads without a bound: one
        # blocked in a system call would hold the exit forever. It joins an idle executor
        # instead; the workers are waited for, bounded, once the loop is closed.
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        workers.shutdown(wait=False, cancel_futures=True)


def _exit_without_blocked_threads(code: int) -> int:
    """``code``, once every thread the interpreter's exit would join has ended; after
    STOP_THREADS_S, exit at once without them (that exit joins them without a bound)."""
    deadline = time.monotonic() + STOP_THREADS_S
    for thread in _joined_at_exit():
        thread.join(max(0.0, deadline - time.monotonic()))
    blocked = [thread.name for thread in _joined_at_exit()]
    if not blocked:
        return code
    log.warning("exiting without waiting for blocked threads", extra={"threads": blocked})
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _joined_at_exit() -> list[threading.Thread]:
    current = threading.current_thread()
    return [t for t in threading.enumerate() if t is not current and not t.daemon and t.is_alive()]
