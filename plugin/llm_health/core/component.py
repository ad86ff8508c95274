"""The shape of a feature wired into the runtime (HDS, ext_authz, admin API, alerts ...).

A component is built by ``app.assemble`` from its own config section and a
``core.control.BoardControl``; it never sees the runtime. All methods run on the runtime's
event loop. A component may also have ``async def prepare(self) -> None``: run before the
first probe and before the gRPC server starts, bounded (fleet mode's warm start).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import grpc

Job = Callable[[], Coroutine[Any, Any, None]]


class Component(Protocol):
    name: str

    def register(self, server: grpc.aio.Server) -> None:
        """Add gRPC servicers (before the server starts)."""

    def tasks(self) -> list[Job]:
        """Long-running coroutines, started after the prober, cancelled on shutdown."""

    def status(self) -> dict[str, Any]:
        """This component's part of /status (JSON-ready; its numbers become metrics)."""
