"""The shape of a feature wired into the runtime (HDS, ext_authz, admin API, alerts ...).

A component is built by ``app.assemble`` from its own config section and a
``core.control.BoardControl``; it never sees the runtime. All methods run on the runtime's
event loop.

Every component is a ``MetricsSource``: it declares its own /metrics families (names, help
texts, types) from its typed counters, and ``ops.metrics`` only collects them
(docs/design.md §5). A series is never derived from a ``status()`` key, so a renamed
JSON key cannot rename a series.

Extension points a component may fill besides (each handed to the runtime by
``app.assemble`` by name, never looked up by type; docs/design.md §8.2): ``Preparing``
and ``SkipRule`` here, ``probe.client.ProbeWrapper`` (it names probe types, which core
cannot) and ``servers.auth.SecurityProvider``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.metrics_core import Metric

if TYPE_CHECKING:  # only a type here: ``llm-health agent`` runs no gRPC and never loads it
    import grpc

Job = Callable[[], Coroutine[Any, Any, None]]


class MetricsSource(Protocol):
    """What /metrics reads of a component. ``Metric`` is prometheus_client's family type
    (``core.families`` builds the plain ones): a value object with no registry behind it,
    so a component needs no exporter of its own and ``ops.metrics`` no translation."""

    def metrics(self) -> Iterable[Metric]:
        """This component's families now. Called on the runtime's loop at every scrape
        (the text is rendered from them in a worker thread): read, never block."""
        ...


class Component(MetricsSource, Protocol):
    name: str

    def register(self, server: grpc.aio.Server) -> None:
        """Add gRPC servicers (before the server starts)."""

    def tasks(self) -> list[Job]:
        """Long-running coroutines, started after the prober, cancelled on shutdown."""

    def status(self) -> dict[str, Any]:
        """This component's part of /status (JSON-ready; /metrics does not read it)."""


class Preparing(Protocol):
    """A component with start-up work: run before the first probe and before the gRPC
    server starts, bounded by the runtime (fleet mode's warm start, docs/design.md §12.7)."""

    name: str

    async def prepare(self) -> None: ...


class ProbeSlot(Protocol):
    """What a skip rule reads of a scheduled probe (``probe.target.ProbeTarget`` is one)."""

    @property
    def cluster(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def interval_s(self) -> float: ...


class SkipRule(Protocol):
    """A component the scheduler asks before each probe: the busy rule
    (``probe.backoff_when_busy``, docs/design.md §15.4). ``app.assemble`` hands it to the
    runtime."""

    def skip(self, target: ProbeSlot) -> bool:
        """Whether this slot's probe may be left out."""
        ...
