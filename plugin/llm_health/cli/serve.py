"""``llm-health serve --config FILE``: the plugin. SIGTERM/SIGINT stop it within 2 s."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_health.cli.validate import load_or_report
from llm_health.ops.logging_setup import setup_logging

if TYPE_CHECKING:
    from llm_health.app.runtime import Runtime

log = logging.getLogger("llm_health")


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="run the plugin: probe, serve xDS to Envoy, serve /status",
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
        asyncio.run(_serve(build_runtime(config, config_path=Path(args.config))))
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0


async def _serve(runtime: Runtime) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, runtime.request_reload)
    await runtime.run(stop)
