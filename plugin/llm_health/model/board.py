"""The board: every endpoint's health, folded from probe results.

Single-owner and synchronous: one task (the app's prober loop) calls ``record``/``drain``;
readers only ever see immutable ``HealthSnapshot`` objects (``model/snapshot.py``), which
``model/snapshot_builder.py`` makes from what the board says it touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from llm_health.model.admission import NO_ADMISSION, Admission, after_probe_token, excused
from llm_health.model.causes import Cause
from llm_health.model.entry import (
    BoardCluster,
    Entry,
    Hold,
    Override,
    ejects_by_failure,
    endpoint_snapshot,
    held_by_limits,
    held_by_signals,
    new_cluster,
    out_of_service,
    outside_allowed,
    still_limited,
)
from llm_health.model.machine import (
    Transition,
    cap,
    drain,
    force_unhealthy,
    initial_health,
    silence,
    step,
    undrain,
)
from llm_health.model.outcome import ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.snapshot import (
    ClusterSnapshot,
    ClusterSpec,
    EndpointSnapshot,
    EndpointSpec,
    HealthSnapshot,
)
from llm_health.model.snapshot_builder import SnapshotBuilder
from llm_health.model.states import EndpointHealth, State

__all__ = [
    "Board",
    "Change",
    "ClusterSnapshot",
    "ClusterSpec",
    "EndpointSnapshot",
    "EndpointSpec",
    "HealthSnapshot",
    "Hold",
    "Override",
    "Reported",
    "outside_allowed",
]


@dataclass(frozen=True, slots=True)
class Change:
    """A state change made outside probing (reload, override, signal, expiry), for logs."""

    cluster: str
    address: str
    transition: Transition | None
    what: str


@dataclass(slots=True)
class Reported:
    """What became of a batch of outside reports (``Board.report``): the transitions of
    the verdicts applied, and the endpoints whose verdict the cap held back."""

    transitions: dict[tuple[str, str], Transition] = field(default_factory=dict)
    held: set[tuple[str, str]] = field(default_factory=set)


class Board:
    """Mutable owner of all endpoint health. Not thread-safe; one owning task.

    ``wall_offset``: add to the monotonic ``now`` the caller passes to get epoch seconds
    (the machine runs on a monotonic clock so a wall-clock jump cannot expire a grace).
    Unknown cluster or endpoint: KeyError from every method that names one.
    ``snapshots``: the builder of its snapshots (a new one unless given), told of every
    change.
    """

    def __init__(
        self,
        clusters: Iterable[ClusterSpec],
        now: float,
        wall_offset: float,
        *,
        snapshots: SnapshotBuilder | None = None,
    ) -> None:
        self._wall_offset = wall_offset
        self._clusters: dict[str, BoardCluster] = {}
        self._snapshots = snapshots if snapshots is not None else SnapshotBuilder()
        for spec in clusters:
            self._clusters[spec.name] = new_cluster(spec, now, known_at_boot=True)

    @property
    def cluster_names(self) -> tuple[str, ...]:
        return tuple(self._clusters)

    def policy(self, cluster: str) -> Policy:
        return self._clusters[cluster].spec.policy

    def has_endpoint(self, cluster: str, address: str) -> bool:
        return cluster in self._clusters and address in self._clusters[cluster].entries

    def record(self, cluster: str, address: str, result: ProbeResult, now: float) -> Transition:
        """Fold one probe result in: a SLOW or TIMEOUT one while the engine admits new
        requests is OVERLOADED (``admission.excused``, docs/design.md §3.5)."""
        entry_cluster = self._clusters[cluster]
        entry = entry_cluster.entries[address]
        policy = entry_cluster.spec.policy
        if entry.admission is not NO_ADMISSION or result.admission:
            admission = entry.admission
            if result.ttft_ms is not None:  # admitted: its own prefill moved the counter
                entry.admission = after_probe_token(admission, now - result.total_ms / 1000, now)
            result = excused(result, admission, now)
        transition = step(entry.health, result, now, policy)
        if entry.signals and entry.health.state is State.UNHEALTHY:
            transition = held_by_signals(entry, transition)
        elif transition.changed and ejects_by_failure(transition, result):
            transition = self._cap_ejection(entry_cluster, entry, transition)
        if entry.limits and transition.after.state in (State.HEALTHY, State.DEGRADED):
            transition = held_by_limits(entry, transition, now)
        entry.health = transition.after
        if transition.after.state is not State.UNHEALTHY:
            entry.ejected_by_failure = False
        elif transition.changed:
            entry.ejected_by_failure = ejects_by_failure(transition, result)
        entry.last = result
        if not entry_cluster.warm and all(e.last for e in entry_cluster.entries.values()):
            entry_cluster.warm = True
        self._touch(cluster, address)
        return transition

    def _cap_ejection(
        self, cluster: BoardCluster, entry: Entry, transition: Transition
    ) -> Transition:
        """docs/design.md §7: if taking this endpoint out would put more than max_ejection_percent
        of the cluster out by probe failures, keep it routed (DEGRADED, reduced weight) and
        say why: many endpoints failing at once points at the prober's own network."""
        total = len(cluster.entries)
        allowed = max(1, total * cluster.spec.policy.max_ejection_percent // 100)
        ejected = sum(1 for e in cluster.entries.values() if e.ejected_by_failure)
        if ejected + 1 <= allowed:
            return transition
        pct = cluster.spec.policy.max_ejection_percent
        reason = (
            f"held: {ejected} of {total} endpoints already out for probe failures "
            f"(max_ejection_percent {pct}); suspect the prober's network. "
            f"{transition.after.reason}"
        )
        kept = State.DEGRADED if transition.from_state is not State.STARTING else State.STARTING
        held = replace(transition.after, state=kept, reason=reason, cause=transition.cause)
        changed = kept is not transition.from_state
        return Transition(transition.from_state, held, changed=changed, cause=transition.cause)

    def note_admission(
        self, cluster: str, address: str, update: Callable[[Admission], Admission]
    ) -> Admission:
        """Update what the endpoint's engine showed of admitting new requests (the engine
        checks' /metrics reads, the access-log stream); ``record`` reads it. Changes nothing
        Envoy sees, so nothing is touched."""
        entry = self._clusters[cluster].entries[address]
        entry.admission = update(entry.admission)
        return entry.admission

    def admission(self, cluster: str, address: str) -> Admission:
        return self._clusters[cluster].entries[address].admission

    def silence(self, cluster: str, address: str, now: float, silent_ms: float) -> Transition:
        """A probe of this endpoint is still silent in flight (``machine.silence``). An
        endpoint held down by an outside signal is left alone."""
        entry = self._clusters[cluster].entries[address]
        if entry.signals:
            return Transition(entry.health.state, entry.health, changed=False, cause=Cause.SILENT)
        return self._apply(cluster, address, lambda h: silence(h, now, silent_ms))

    def adopt(
        self, cluster: str, address: str, health: EndpointHealth, last: ProbeResult | None
    ) -> Transition:
        """Take ``health`` as this endpoint's health as it is: the verdict of the member of
        the fleet that owns it (docs/design.md §12). No state machine runs; if this replica
        becomes the owner, its machine continues from here. An endpoint held down by an
        outside signal here (HDS) stays held: only the counters and last result move; one
        being removed from this board (reload, DNS) keeps draining. A verdict that takes
        the endpoint out, whatever cause it names, is another member's word: it counts
        and is held like an ejection by probe failures (``max_ejection_percent``, §7.3)."""
        entry_cluster = self._clusters[cluster]
        entry = entry_cluster.entries[address]
        before = entry.health
        if entry.removing_at is not None:  # leaving this board: draining out here
            return Transition(before.state, before, changed=False, cause=before.cause)
        if entry.signals:
            health = replace(health, state=before.state, reason=before.reason, cause=before.cause)
        ejects = health.state is State.UNHEALTHY and before.state is not State.UNHEALTHY
        transition = Transition(
            before.state, health, changed=before.state is not health.state, cause=health.cause
        )
        if ejects:
            transition = self._cap_ejection(entry_cluster, entry, transition)
        entry.health = transition.after
        if transition.after.state is not State.UNHEALTHY:
            entry.ejected_by_failure = False
        elif ejects:
            entry.ejected_by_failure = True
        if last is not None:
            entry.last = last
        if not entry_cluster.warm and all(e.last for e in entry_cluster.entries.values()):
            entry_cluster.warm = True
        self._touch(cluster, address)
        return transition

    def drain(self, cluster: str, address: str, now: float, reason: str) -> Transition:
        return self._apply(cluster, address, lambda h: drain(h, now, reason))

    def undrain(self, cluster: str, address: str, now: float) -> Transition:
        policy = self._clusters[cluster].spec.policy
        return self._apply(cluster, address, lambda h: undrain(h, now, policy))

    def set_signal(
        self,
        cluster: str,
        address: str,
        source: str,
        down: str | None,
        now: float,
        cause: Cause = Cause.SIGNAL,
    ) -> Transition:
        """An outside verdict from ``source``: ``down`` is the reason it says the endpoint
        is unusable, None when it says it is fine again. Down forces UNHEALTHY; up only
        lifts the hold (recovery then needs the normal ``healthy_after`` successes)."""
        entry = self._clusters[cluster].entries[address]
        if down is None:
            entry.signals.pop(source, None)
            self._touch(cluster, address)
            return Transition(entry.health.state, entry.health, changed=False, cause=cause)
        entry.signals[source] = Hold(down, cause)
        return self._apply(cluster, address, lambda h: force_unhealthy(h, now, down, cause))

    def set_limit(
        self,
        cluster: str,
        address: str,
        source: str,
        reason: str | None,
        now: float,
        cause: Cause = Cause.SATURATED,
        *,
        reported: bool = False,
    ) -> Transition:
        """An outside limit from ``source`` (the engine's own metrics): ``reason`` says why
        the endpoint may be at most DEGRADED, None lifts the limit. A HEALTHY endpoint goes
        DEGRADED now; lifting changes nothing at once (the fast streak was reset, so the
        usual ``healthy_after`` fast probes bring it back). ``reported``: see ``Hold``."""
        entry = self._clusters[cluster].entries[address]
        if reason is None:
            had = entry.limits.pop(source, None)
            if had is not None:
                entry.health = still_limited(entry, had)
                self._touch(cluster, address)
            return Transition(entry.health.state, entry.health, changed=False, cause=cause)
        hold = Hold(reason, cause, reported)
        if entry.limits.get(source) == hold and entry.health.state is not State.HEALTHY:
            return Transition(entry.health.state, entry.health, changed=False, cause=cause)
        entry.limits[source] = hold
        return self._apply(cluster, address, lambda h: cap(h, now, reason, cause))

    def report(
        self,
        source: str,
        verdicts: Mapping[tuple[str, str], str | None],
        now: float,
        *,
        cause: Cause,
        limit: bool = False,
        capped: bool,
    ) -> Reported:
        """Verdicts of an outside source fed by reports (HDS, access logs): per endpoint the
        reason it is unusable (a signal: UNHEALTHY) or, with ``limit``, why it may be at
        most DEGRADED (a limit); None lifts it. Endpoints not on the board are skipped.

        ``capped``: the reporters are not authenticated (no ``server.token``, no mutual
        TLS), so anyone who reaches the port could be one. Then a verdict that would take
        an endpoint out of full service is applied only while its cluster's endpoints out
        (held by a signal or a reported limit, or UNHEALTHY by probe) stay within
        ``outside_allowed``; the rest are returned as held, and the caller submits them
        again with its next reports. One cap for every reporting source: together they
        never hold out more (docs/design.md §7.3). Lifts go first: they free room."""
        result = Reported()
        rooms: dict[str, tuple[set[str], int]] = {}
        order = sorted(verdicts.items(), key=lambda item: (item[1] is not None, item[0]))
        for (cluster, address), reason in order:
            if not self.has_endpoint(cluster, address):
                continue
            if reason is not None and capped and not self._outside_fits(cluster, address, rooms):
                result.held.add((cluster, address))
                continue
            if limit:
                transition = self.set_limit(
                    cluster, address, source, reason, now, cause, reported=True
                )
            else:
                transition = self.set_signal(cluster, address, source, reason, now, cause)
            result.transitions[(cluster, address)] = transition
        return result

    def set_override(
        self, cluster: str, address: str, state: State, until: float, reason: str
    ) -> None:
        """Force ``state`` (as seen by Envoy and readers) until ``until``; probing goes on."""
        entry = self._clusters[cluster].entries[address]
        entry.override = Override(state, until, reason or f"forced {state.value}")
        self._touch(cluster, address)

    def clear_override(self, cluster: str, address: str) -> bool:
        entry = self._clusters[cluster].entries[address]
        had, entry.override = entry.override is not None, None
        self._touch(cluster, address)
        return had

    def expire(self, now: float) -> list[Change]:
        """Drop overrides whose time is up, and endpoints/clusters removed from the config
        whose drain_time is over. Call periodically (e.g. every second)."""
        changes = [*self._expire_overrides(now), *self._expire_removed(now)]
        if changes:
            self._touch()
        return changes

    def apply_specs(
        self, specs: Iterable[ClusterSpec], now: float, *, source: str = "config"
    ) -> list[Change]:
        """Hot reload or a discovered set: new clusters/endpoints start in STARTING (a
        ``Cause.ADDED`` transition, unchanged state); removed ones go DRAINING and
        disappear after drain_time; policies and weights of kept ones change in place;
        the health of unchanged endpoints is kept. ``source`` names where the new set
        comes from in reasons ("config", "DNS")."""
        wanted = {spec.name: spec for spec in specs}
        changes = self._remove_clusters(wanted, now)
        for spec in wanted.values():
            changes.extend(self._update_cluster(spec, now, source))
        self._touch()
        return changes

    def mark_warm(self, cluster: str | None = None) -> None:
        """Declare clusters warm (warm_start_timeout passed). None: all of them. A cluster
        with no endpoint yet (discovery has not answered) stays cold: pushing it would
        empty it in an Envoy that still routes on what it had (docs/design.md §11.3)."""
        for name, entry_cluster in self._clusters.items():
            if cluster in (None, name) and not entry_cluster.warm and entry_cluster.entries:
                entry_cluster.warm = True
                self._touch()

    def is_warm(self, cluster: str) -> bool:
        return self._clusters[cluster].warm

    def health(self, cluster: str, address: str) -> EndpointHealth:
        return self._clusters[cluster].entries[address].health

    def signal(self, cluster: str, address: str, source: str) -> str | None:
        """The reason ``source``'s signal holds this endpoint down, None if it does not."""
        hold = self._clusters[cluster].entries[address].signals.get(source)
        return hold.reason if hold is not None else None

    def last_result(self, cluster: str, address: str) -> ProbeResult | None:
        """The endpoint's last probe result (or adopted verdict), None before any."""
        return self._clusters[cluster].entries[address].last

    def snapshot(self) -> HealthSnapshot:
        """The board as readers see it (the same object until something changes)."""
        return self._snapshots.snapshot(self._clusters, self._render)

    def replace_policy(self, cluster: str, policy: Policy) -> None:
        entry_cluster = self._clusters[cluster]
        entry_cluster.spec = replace(entry_cluster.spec, policy=policy)
        self._touch(cluster)

    # --- internals ---------------------------------------------------------------------

    def _render(self, name: str, address: str) -> EndpointSnapshot:
        cluster = self._clusters[name]
        share = cluster.spec.policy.degraded_weight
        return endpoint_snapshot(name, cluster.entries[address], share, self._wall_offset)

    def _outside_fits(
        self, cluster: str, address: str, rooms: dict[str, tuple[set[str], int]]
    ) -> bool:
        """Whether an outside verdict may take ``address`` out now: it is out already, or
        its cluster has room (``rooms`` caches, per cluster of one batch, the addresses out
        and the room left; taking one uses it)."""
        if cluster not in rooms:
            entries = self._clusters[cluster].entries
            out = {a for a, e in entries.items() if out_of_service(e)}
            allowed = outside_allowed(len(entries), self.policy(cluster).max_ejection_percent)
            rooms[cluster] = (out, allowed - len(out))
        out, room = rooms[cluster]
        if address in out:
            return True
        if room <= 0:
            return False
        out.add(address)
        rooms[cluster] = (out, room - 1)
        return True

    def _apply(
        self, cluster: str, address: str, change: Callable[[EndpointHealth], Transition]
    ) -> Transition:
        entry = self._clusters[cluster].entries[address]
        transition = change(entry.health)
        entry.health = transition.after
        self._touch(cluster, address)
        return transition

    def _touch(self, cluster: str | None = None, address: str | None = None) -> None:
        """Something changed: the next ``snapshot()`` rebuilds ``address`` of ``cluster``
        (both None: everything; address None: the whole cluster)."""
        self._snapshots.touch(cluster, address)

    def _expire_overrides(self, now: float) -> Iterator[Change]:
        for name, cluster in self._clusters.items():
            for address, entry in cluster.entries.items():
                if entry.override is not None and entry.override.until <= now:
                    entry.override = None
                    yield Change(name, address, None, "override expired")

    def _expire_removed(self, now: float) -> Iterator[Change]:
        for name, cluster in list(self._clusters.items()):
            if cluster.removing_at is not None and cluster.removing_at <= now:
                del self._clusters[name]
                yield Change(name, "*", None, "cluster removed after drain_time")
                continue
            for address, entry in list(cluster.entries.items()):
                if entry.removing_at is not None and entry.removing_at <= now:
                    del cluster.entries[address]
                    yield Change(name, address, None, "endpoint removed after drain_time")

    def _remove_clusters(self, wanted: Mapping[str, ClusterSpec], now: float) -> list[Change]:
        changes = []
        for name, cluster in self._clusters.items():
            if name in wanted or cluster.removing_at is not None:
                continue
            cluster.removing_at = now + cluster.spec.policy.drain_time_s
            for address in cluster.entries:
                changes.append(self._retire(name, address, now, "config"))
        return changes

    def _update_cluster(self, spec: ClusterSpec, now: float, source: str) -> list[Change]:
        cluster = self._clusters.get(spec.name)
        if cluster is None or cluster.removing_at is not None:
            self._clusters[spec.name] = new_cluster(spec, now, known_at_boot=False)
            return [Change(spec.name, "*", None, "cluster added")]
        cluster.spec = spec
        wanted = {e.address: e for e in spec.endpoints}
        changes = [
            self._retire(spec.name, a, now, source)
            for a, e in cluster.entries.items()
            if a not in wanted and e.removing_at is None
        ]
        for endpoint in wanted.values():
            changes.extend(self._keep_or_add(cluster, endpoint, now, source))
        return changes

    def _keep_or_add(
        self, cluster: BoardCluster, endpoint: EndpointSpec, now: float, source: str
    ) -> list[Change]:
        entry = cluster.entries.get(endpoint.address)
        if entry is not None and entry.removing_at is None:
            entry.spec = endpoint  # weight may have changed; health is kept
            return []
        # Found before the cluster's first probe round ended (discovery answering just
        # after a (re)start): as much "known at boot" as a configured endpoint.
        booting = cluster.known_at_boot and not cluster.warm
        health = initial_health(now, cluster.spec.policy, known_at_boot=booting)
        if not booting and source != "config":
            health = replace(health, reason=f"new endpoint (from {source})")
        cluster.entries[endpoint.address] = Entry(endpoint, health)
        added = Transition(State.STARTING, health, changed=False, cause=Cause.ADDED)
        what = "endpoint added" if source == "config" else f"endpoint added from {source}"
        return [Change(cluster.spec.name, endpoint.address, added, what)]

    def _retire(self, cluster: str, address: str, now: float, source: str) -> Change:
        entry = self._clusters[cluster].entries[address]
        entry.removing_at = now + self._clusters[cluster].spec.policy.drain_time_s
        gone = "removed from config" if source == "config" else f"gone from {source}"
        transition = drain(entry.health, now, gone, Cause.REMOVED)
        entry.health = transition.after
        return Change(cluster, address, transition, f"endpoint {gone}")
