"""Which endpoints exist: the config's own plus what discovery found (docs/design.md §11).

The one place that turns (config in force, discovered sets) into the board's clusters and
the prober's targets. A reload and a discovered change both go through ``apply``, which
computes the full set at the moment it runs on the board (inside ``control.update``), so
the two can never undo each other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from llm_health.app.keeper import BoardKeeper
from llm_health.app.live import LiveConfig
from llm_health.config.rules import MAX_ENDPOINTS
from llm_health.model.board import Change, EndpointSpec
from llm_health.probe.target import ProbeTarget

TargetsListener = Callable[[list[ProbeTarget]], None]
ProbeFilter = Callable[[str, str], bool]  # (cluster, address) -> probed by this replica
log = logging.getLogger("llm_health")


class EndpointCatalog:
    def __init__(self, live: LiveConfig, control: BoardKeeper) -> None:
        self._live = live
        self._control = control
        self._discovered: dict[str, tuple[EndpointSpec, ...]] = {}
        self._listeners: list[TargetsListener] = []
        self._probes: ProbeFilter | None = None
        self._filter_read = False  # a reader took the filter as it was: it is fixed now
        self._version = 0  # of ``_discovered``: bumped by every change
        # The targets of (config in force, ``_version``), made once: every component
        # holding its own copy of every endpoint's target took ~0.6 KiB an endpoint each.
        self._made: tuple[object, int, list[ProbeTarget]] | None = None

    @property
    def discovered(self) -> Mapping[str, tuple[EndpointSpec, ...]]:
        return self._discovered

    def targets(self) -> list[ProbeTarget]:
        """Every endpoint to probe: configured and discovered, each cluster's settings
        (the same targets until either changes; a new list each call)."""
        config, made = self._live.current, self._made
        if made is None or made[0] is not config or made[1] != self._version:
            made = self._made = (config, self._version, config.probe_targets(self._discovered))
        return list(made[2])

    def on_targets(self, listener: TargetsListener) -> None:
        """Call ``listener(targets)`` after every change of the endpoint set or of the
        probe filter (the prober)."""
        self._listeners.append(listener)

    def set_probe_filter(self, probes: ProbeFilter | None) -> None:
        """Which endpoints this replica probes itself (fleet mode: those it owns); None:
        all of them. Call ``refilter`` when its answers change. Only before anything reads
        it (``app.assemble`` builds the fleet first): a component built earlier would
        have taken every endpoint as probed here."""
        if self._filter_read:
            raise RuntimeError("the probe filter is set after components read it")
        self._probes = probes

    def probes_here(self, cluster: str, address: str) -> bool:
        """Whether this replica probes (and so acts for) the endpoint."""
        self._filter_read = True
        return self._probes is None or self._probes(cluster, address)

    def probed(self, targets: list[ProbeTarget]) -> list[ProbeTarget]:
        """The targets this replica probes itself (all, without a filter)."""
        self._filter_read = True
        if self._probes is None:
            return targets
        return [t for t in targets if self._probes(t.cluster, t.address)]

    def refilter(self) -> None:
        """The probe filter's answers changed (ownership moved): tell the listeners."""
        targets = self.targets()
        for listener in self._listeners:
            listener(targets)

    async def set_discovered(self, cluster: str, endpoints: tuple[EndpointSpec, ...]) -> None:
        """Discovery found ``endpoints`` for ``cluster`` (a non-empty, successful answer)."""
        room = MAX_ENDPOINTS - self._count_without(cluster)
        if len(endpoints) > room:
            log.warning(
                "discovery: endpoints over the limit left out",
                extra={"cluster": cluster, "found": len(endpoints), "limit": MAX_ENDPOINTS},
            )
            endpoints = endpoints[: max(room, 0)]
        if self._discovered.get(cluster) == endpoints:
            return
        self._discovered[cluster] = endpoints
        self._version += 1
        await self.apply(source="DNS")

    async def forget(self, clusters: set[str]) -> None:
        """Discovery no longer runs for ``clusters`` (reload): their found endpoints go."""
        if clusters & self._discovered.keys():
            for cluster in clusters:
                self._discovered.pop(cluster, None)
            self._version += 1
            await self.apply(source="config")

    async def apply(self, *, source: str = "config") -> list[Change]:
        """Bring the board and the prober to the current endpoint set; log and report
        every change (added and removed endpoints are alert-able transitions)."""
        changes = await self._control.update(
            lambda board, now: board.apply_specs(
                self._live.current.cluster_specs(self._discovered), now, source=source
            )
        )
        for change in changes:
            if change.transition is None or not change.transition.changed:
                fields = {"cluster": change.cluster, "endpoint": change.address}
                log.info(change.what, extra=fields)  # a state change logs itself (notify)
            if change.transition is not None:
                self._control.notify(change.cluster, change.address, change.transition, None)
        self.refilter()
        return changes

    def _count_without(self, cluster: str) -> int:
        config = self._live.current
        static = sum(len(c.endpoints) for c in config.clusters)
        found = sum(len(e) for name, e in self._discovered.items() if name != cluster)
        return static + found
