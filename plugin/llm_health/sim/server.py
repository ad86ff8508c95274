"""Running the simulator on real sockets: one application, one state, many ports.

:func:`serve` runs until cancelled (the ``llm-health sim`` command); :func:`running_sim`
runs for an ``async with`` block (tests, benchmarks). Every port of one simulator serves
the same application, so they share one :class:`~llm_health.sim.state.SimState`.

This module is also the simulator's documented Python entry point (``docs/simulator.md``):
it names :class:`SimSettings`, :func:`build_app` and :data:`STATE_KEY` alongside its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from llm_health.sim.app import STATE_KEY, build_app
from llm_health.sim.state import SimSettings, SimState

__all__ = ["STATE_KEY", "SimHandle", "SimSettings", "build_app", "running_sim", "serve"]

#: Grace given to handlers at shutdown before aiohttp cancels them.
_SHUTDOWN_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class SimHandle:
    """A running simulator: where it listens and its shared state."""

    host: str
    ports: tuple[int, ...]
    state: SimState
    app: web.Application

    @property
    def port(self) -> int:
        """The first (usually only) port."""
        return self.ports[0]

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the first port."""
        return _base_url(self.host, self.port)

    @property
    def base_urls(self) -> list[str]:
        """``http://host:port`` of every port, in order."""
        return [_base_url(self.host, port) for port in self.ports]


def _base_url(host: str, port: int) -> str:
    """``http://host:port`` with IPv6 hosts bracketed."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


async def _start(
    settings: SimSettings, host: str, ports: Sequence[int]
) -> tuple[web.AppRunner, SimHandle]:
    """Start one app listening on every port in ``ports`` (0: ephemeral); clean up on error."""
    if not ports:
        raise ValueError("at least one port is required")
    app = build_app(settings)
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S
    )
    await runner.setup()
    try:
        for port in ports:
            await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = tuple(dict.fromkeys(address[1] for address in runner.addresses))
    return runner, SimHandle(host=host, ports=bound, state=app[STATE_KEY], app=app)


async def serve(
    host: str,
    ports: Sequence[int],
    settings: SimSettings,
    *,
    on_ready: Callable[[SimHandle], None] | None = None,
) -> None:
    """Serve one simulator (one shared SimState) on every port until cancelled.

    Raises OSError if a port cannot be bound (nothing is left listening then).
    ``on_ready`` is called once every port listens. Cancellation shuts the server down
    (hangs released, handlers cancelled after at most ~1 s) and re-raises.
    """
    runner, handle = await _start(settings, host, ports)
    try:
        if on_ready is not None:
            on_ready(handle)
        await asyncio.get_running_loop().create_future()
    finally:
        await runner.cleanup()


@asynccontextmanager
async def running_sim(
    settings: SimSettings | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    port_count: int = 1,
) -> AsyncIterator[SimHandle]:
    """Run a simulator in this event loop for the duration of the ``async with`` block.

    With ``port=0`` every one of the ``port_count`` sites gets its own ephemeral port;
    otherwise ports ``port .. port+port_count-1`` are used. All share one state.
    """
    if port_count < 1:
        raise ValueError("port_count must be at least 1")
    ports = [0] * port_count if port == 0 else list(range(port, port + port_count))
    runner, handle = await _start(settings or SimSettings(), host, ports)
    try:
        yield handle
    finally:
        await runner.cleanup()
