"""``llm-health sim``: run the fault-injecting fake inference server from the command line.

Exit codes: 0 after SIGINT/SIGTERM, 1 if a port cannot be bound, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from llm_health.cli.argtypes import MAX_PORT, duration, integer, port, positive_int
from llm_health.cli.commands import summary
from llm_health.probe.loop import run as run_on
from llm_health.sim.engines import ENGINE_NAMES
from llm_health.sim.faults import AFFECTS_MODES, FAULTS, INFO_MODES, OVERLOAD_STATUSES, FaultSpec
from llm_health.sim.server import SimHandle, SimSettings, serve


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sim`` subcommand to ``subparsers`` (from ``add_subparsers``); return it."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sim",
        help=summary("sim"),
        description=(
            "An OpenAI-compatible (vLLM-flavoured) fake inference server with fault "
            "injection. Change the fault at run time with POST /sim/fault; read counters "
            "at GET /sim/stats. See docs/simulator.md."
        ),
        epilog="faults: " + "; ".join(f"{name}: {text}" for name, text in FAULTS.items()),
    )
    _add_server_arguments(parser)
    _add_fault_arguments(parser)
    parser.set_defaults(func=run, sim_parser=parser)
    return parser


def _add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Where to listen and what to serve."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument("--port", type=port, required=True, help="first port to listen on")
    parser.add_argument(
        "--port-count",
        type=positive_int,
        default=1,
        metavar="N",
        help="serve ports P..P+N-1, all sharing one state (default %(default)s)",
    )
    parser.add_argument("--model", default="sim-model", help="model name (default %(default)s)")
    parser.add_argument(
        "--accept-any-model",
        action="store_true",
        help="serve requests naming any model (default: 404 like vLLM)",
    )
    parser.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*"
    )
    parser.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=256,
        help="capacity behind the KV-cache usage gauge (default %(default)s)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINE_NAMES,
        default="vllm",
        help="engine played: its /metrics names and info endpoint (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=None, help="RNG seed for jitter and fault_rate")
    parser.add_argument(
        "--record-first-tokens",
        type=_non_negative,
        default=0,
        metavar="N",
        help=(
            "keep per port the wall-clock times (time.time()) of the last N first-token "
            "writes of probe requests, in /sim/stats as first_token_writes (default 0: off)"
        ),
    )


def _add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    """The initial fault and its knobs (all changeable later with POST /sim/fault)."""
    defaults = FaultSpec()
    parser.add_argument("--fault", choices=list(FAULTS), default="none", help="initial fault")
    parser.add_argument("--ttft", type=duration, default=defaults.ttft, help="default 50ms")
    parser.add_argument("--ttft-jitter", type=duration, default=defaults.ttft_jitter)
    parser.add_argument(
        "--tpot", type=duration, default=defaults.tpot, help="time per output token; 10ms"
    )
    parser.add_argument(
        "--fault-rate",
        type=_fraction,
        default=defaults.fault_rate,
        help="fraction 0..1 of inference requests the fault applies to (default 1.0)",
    )
    parser.add_argument(
        "--affects",
        choices=AFFECTS_MODES,
        default=defaults.affects,
        help=(
            "requests the fault applies to: all, or users (not those with "
            "'X-LLM-Probe: true', which are served normally) (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--info",
        choices=INFO_MODES,
        default=defaults.info,
        help=(
            "GET /v1/models and the engines' info endpoints: ok, or hang (a wedged server "
            "that answers nothing until --hang-max) (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--startup-delay",
        type=duration,
        default=defaults.startup_delay,
        help="startup_delay fault: 503 for this long (default 30s)",
    )
    parser.add_argument(
        "--overload-status",
        type=int,
        choices=OVERLOAD_STATUSES,
        default=defaults.overload_status,
        help="overloaded fault: 429 or 503 (default 429)",
    )
    parser.add_argument(
        "--load-ttft-per-request",
        type=duration,
        default=defaults.load_ttft_per_request,
        help="slow_under_load fault: extra TTFT per other in-flight request (default 20ms)",
    )
    parser.add_argument(
        "--hang-max",
        type=duration,
        default=defaults.hang_max,
        help="upper bound of every hang (default 3600s)",
    )


def _non_negative(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _fraction(text: str) -> float:
    """argparse type: a number between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    """Build SimSettings from parsed arguments; raise ValueError naming a bad combination."""
    if args.port + args.port_count - 1 > MAX_PORT:
        raise ValueError(
            f"--port {args.port} with --port-count {args.port_count} goes past port {MAX_PORT}"
        )
    fault = FaultSpec(
        fault=args.fault,
        ttft=args.ttft,
        ttft_jitter=args.ttft_jitter,
        tpot=args.tpot,
        fault_rate=args.fault_rate,
        startup_delay=args.startup_delay,
        overload_status=args.overload_status,
        load_ttft_per_request=args.load_ttft_per_request,
        hang_max=args.hang_max,
        info=args.info,
        affects=args.affects,
    )
    return SimSettings(
        model=args.model,
        fault=fault,
        seed=args.seed,
        max_num_seqs=args.max_num_seqs,
        accept_any_model=args.accept_any_model,
        api_key=args.api_key,
        engine=args.engine,
        record_first_tokens=args.record_first_tokens,
    )


def run(args: argparse.Namespace) -> int:
    """Run the simulator until SIGINT/SIGTERM; return 0 then, 1 if a port cannot be bound."""
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        args.sim_parser.error(str(exc))  # exits with status 2
    ports = list(range(args.port, args.port + args.port_count))
    # uvloop when installed, as serve and agent by default: a simulator standing in for
    # thousands of endpoints beside the prober should cost it as little CPU as it can.
    return run_on(_serve_until_signal(args.host, ports, settings), "auto")


def announce(handle: SimHandle, settings: SimSettings) -> str:
    """The one start-up line, e.g. ``llm-health sim listening on http://127.0.0.1:8000 (…)``."""
    details = f"model {settings.model}, fault {settings.fault.fault}"
    if settings.engine != "vllm":
        details += f", engine {settings.engine}"
    if len(handle.ports) > 1:
        details += f", ports {handle.ports[0]}-{handle.ports[-1]}"
    return f"llm-health sim listening on {handle.base_url} ({details})"


async def _serve_until_signal(host: str, ports: list[int], settings: SimSettings) -> int:
    """Serve until SIGINT or SIGTERM arrives; report bind errors on stderr (exit 1)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    def on_ready(handle: SimHandle) -> None:
        print(announce(handle, settings), flush=True)

    server = asyncio.create_task(serve(host, ports, settings, on_ready=on_ready))
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({server, stopper}, return_when=asyncio.FIRST_COMPLETED)
        return await _stop(server, stopper, f"{host}:{ports[0]}")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def _stop(server: asyncio.Task[None], stopper: asyncio.Task[bool], where: str) -> int:
    """Cancel both tasks and wait for them; 1 if the server had failed to bind, else 0."""
    stopper.cancel()
    server.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stopper
    try:
        await server
    except asyncio.CancelledError:
        return 0
    except OSError as exc:
        print(f"llm-health sim: cannot listen on {where}: {exc}", file=sys.stderr)
        return 1
    return 0
