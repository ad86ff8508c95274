"""``llm-health agent --engine URL [--http HOST:PORT] [--config FILE]``: beside one engine
in its pod, answer the kubelet's startup, readiness and liveness probes (docs/agent.md).
Bad arguments and a bad file: exit 2 with what to write; SIGTERM/SIGINT stop it within 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import TYPE_CHECKING, Any

from llm_health.agent.settings import DEFAULT_HTTP, ENGINE_EXAMPLE, engine_address, http_bind
from llm_health.cli.commands import summary
from llm_health.cli.validate import loaded_or_reported
from llm_health.ops.logging_setup import setup_logging
from llm_health.probe.loop import run as run_loop

if TYPE_CHECKING:
    from llm_health.app.agent import Agent
    from llm_health.config.agent import AgentFile

log = logging.getLogger("llm_health")


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "agent",
        help=summary("agent"),
        description="Probe the one engine of this pod (--engine) as the gateway side does "
        "and answer the kubelet: /startupz (model loaded, first token seen), /readyz (the "
        "engine serves now), /livez (restart the engine container: a fatal error or a hang, "
        "for agent.restart_after), /healthz (the agent itself), /metrics, /status.",
    )
    parser.add_argument(
        "--engine",
        metavar="URL",
        type=_engine,
        help=f"the engine in this pod (required), e.g. {ENGINE_EXAMPLE}",
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        type=_http,
        default=DEFAULT_HTTP,
        help="where the kubelet asks (default %(default)s)",
    )
    parser.add_argument(
        "--config",
        "-c",
        metavar="FILE",
        help="a file with the sections probe: (as for serve) and agent: (default: all defaults)",
    )
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info"
    )
    parser.set_defaults(func=run, agent_parser=parser)


def _engine(text: str) -> str:
    try:
        return engine_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _http(text: str) -> str:
    try:
        return http_bind(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    if args.engine is None:
        args.agent_parser.error(
            f"--engine URL is required: the engine in this pod, e.g. --engine {ENGINE_EXAMPLE}"
        )
    setup_logging(args.log_format, args.log_level)
    file = _load(args.config)
    if file is None:
        return 2
    from llm_health.app.agent import Agent  # the probing stack loads only for `agent`

    try:
        run_loop(_serve(Agent(file, args.engine, args.http)), file.agent.event_loop)
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0


def _load(path: str | None) -> AgentFile | None:
    from llm_health.config.agent import AgentFile, load_agent_config

    if path is None:
        return AgentFile()
    return loaded_or_reported(path, load_agent_config)


async def _serve(agent: Agent) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await agent.run(stop)
