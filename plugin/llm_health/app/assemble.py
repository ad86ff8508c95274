"""Build a ``Runtime`` and its components from a config: the one place that knows every
part. Each component gets its own config section and the ``BoardControl`` seam, never the
runtime, so a new source of verdicts plugs in here with one line.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llm_health.admin.component import AdminComponent
from llm_health.alerts.component import attach as attach_alerts
from llm_health.app.endpoints import EndpointCatalog
from llm_health.app.keeper import BoardKeeper
from llm_health.app.live import LiveConfig
from llm_health.app.runtime import Runtime
from llm_health.authz.component import AuthzComponent
from llm_health.config import Config
from llm_health.core.component import Component, Preparing, SkipRule
from llm_health.core.control import ProberStats
from llm_health.discovery.component import DiscoveryComponent
from llm_health.engines.component import EngineChecks
from llm_health.engines.settings import ClusterChecks
from llm_health.hds.component import HdsComponent
from llm_health.model.board import Board
from llm_health.model.engine_load import EngineLoad
from llm_health.ops.metrics import RuntimeMetrics
from llm_health.ops.secret_scrubbing import Secrets
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.target import ProbeTarget
from llm_health.remediation.component import RemediationComponent
from llm_health.servers.auth import GrpcAuth, SecurityProvider
from llm_health.traffic.component import TrafficComponent
from llm_health.xds.nodes import OpenNodes
from llm_health.xds.stream import XdsStats

if TYPE_CHECKING:
    from llm_health.fleet.component import FleetComponent


def build_runtime(
    config: Config,
    clock: Callable[[], float] = time.monotonic,
    config_path: Path | None = None,
) -> Runtime:
    now = clock()
    board = Board(config.cluster_specs(), now, time.time() - now)
    lag = LoopLagMonitor()
    control = BoardKeeper(board, clock, ProberStats(lag))
    live = LiveConfig(config, config_path)
    catalog = EndpointCatalog(live, control)
    xds_nodes = OpenNodes()  # node ids with an open xDS stream: reports count only from those
    secrets = Secrets(config.secret_values())  # the runtime's: it follows reloads
    parts = build_components(
        live, control, clock, xds_open=xds_nodes.is_open, catalog=catalog, secrets=secrets
    )
    components = parts.components
    xds_stats = XdsStats()
    metrics = RuntimeMetrics(control, control.stats, xds_stats, components)
    return Runtime(
        live,
        control,
        components,
        metrics,
        lag,
        xds_stats,
        clock,
        xds_nodes=xds_nodes,
        catalog=catalog,
        probe_wrapper=parts.checks,
        security=parts.security,
        skip=parts.skip,
        preparing=parts.preparing,
        secrets=secrets,
    )


@dataclass(frozen=True, slots=True)
class Parts:
    """Every component, and the ones the runtime calls itself, by their role."""

    components: list[Component]
    security: SecurityProvider  # the main gRPC server's token and TLS
    skip: SkipRule  # the scheduler's busy rule
    checks: EngineChecks  # the engine checks: the runtime's probe wrapper
    preparing: tuple[Preparing, ...]  # start-up work before the first probe (fleet)


def build_components(
    live: LiveConfig,
    control: BoardKeeper,
    clock: Callable[[], float],
    *,
    xds_open: Callable[[str], bool] | None = None,
    catalog: EndpointCatalog | None = None,
    secrets: Secrets | None = None,
) -> Parts:
    """Each feature adds itself here (one line each). Settings read once at start, except
    where a getter over ``live`` follows reloads (ext_authz, discovery, engine checks).
    ``xds_open``: whether a node id holds an open xDS stream (HDS and the access logs
    count only those nodes' reports). ``catalog``: the endpoint set discovery feeds (None:
    no discovery, e.g. in tests). ``secrets``: the runtime's, scrubbed from what the alerts
    and the admin API send. Also returned apart: the engine checks, the runtime's probe
    wrapper."""
    config = live.current
    fleet = _fleet(config, control, catalog)  # first: its probe filter is read below
    grpc_auth = GrpcAuth(config.server, exempt_admin=config.admin.own_token_on_shared_port)
    components: list[Component] = [
        grpc_auth,
        AdminComponent(
            config.admin,
            config.server.grpc,
            control,
            shared_authenticated=grpc_auth.authenticated,
            secrets=secrets,
        ),
        attach_alerts(config.alerts, control, secrets),
        AuthzComponent(
            control.hub,
            lambda: live.current.authz,
            listen=config.server.authz,
            security=grpc_auth.security,
            isolation=config.server.authz_isolation,
            auth_stats=grpc_auth.stats,
        ),
        HdsComponent(
            config.hds,
            control,
            clock,
            xds_open=xds_open,
            authenticated=grpc_auth.authenticated,
        ),
    ]
    if catalog is not None:
        components.append(DiscoveryComponent(lambda: live.current.discovery(), catalog, control))
    if config.remediation:
        components.append(_remediation(config, control, catalog))
    traffic = _traffic(live, control, clock, catalog, xds_open, grpc_auth.authenticated)
    components.append(traffic)
    checks = _engine_checks(live, control, clock, catalog, traffic.feed_load)
    components.append(checks)
    if fleet is not None:
        components.append(fleet)
    preparing = (fleet,) if fleet is not None else ()
    return Parts(components, grpc_auth.security, traffic, checks, preparing)


def _fleet(
    config: Config, control: BoardKeeper, catalog: EndpointCatalog | None
) -> FleetComponent | None:
    """Fleet mode (docs/design.md §12): built before every component that reads the
    catalog's probe filter (traffic, engine checks, remediation, the prober), and so
    first to follow an endpoint change (its owners before their probed sets)."""
    if catalog is None or config.fleet is None:
        return None
    # Imported only in fleet mode: the Redis client is 8 MiB of every process's memory.
    from llm_health.fleet.component import FleetComponent

    member = config.fleet.member(f"{socket.gethostname()}-{os.getpid()}")
    fleet = FleetComponent(config.fleet, member, control, catalog)
    catalog.set_probe_filter(fleet.probes_here)
    return fleet


def _traffic(
    live: LiveConfig,
    control: BoardKeeper,
    clock: Callable[[], float],
    catalog: EndpointCatalog | None,
    xds_open: Callable[[str], bool] | None,
    authenticated: bool,
) -> TrafficComponent:
    """Passive health: Envoy's access logs and the engines' TTFT, per endpoint."""
    targets = catalog.targets() if catalog is not None else live.current.probe_targets()
    traffic = TrafficComponent(
        control,
        lambda: live.current.traffic_settings(),
        targets,
        clock,
        xds_open=xds_open,
        authenticated=authenticated,
    )
    traffic.set_probed(catalog.probed(targets) if catalog is not None else targets)
    if catalog is not None:

        def follow(targets: list[ProbeTarget]) -> None:
            traffic.set_targets(targets)
            traffic.set_probed(catalog.probed(targets))

        catalog.on_targets(follow)
    return traffic


def _engine_checks(
    live: LiveConfig,
    control: BoardKeeper,
    clock: Callable[[], float],
    catalog: EndpointCatalog | None,
    on_load: Callable[[ProbeTarget, EngineLoad], None] | None = None,
) -> EngineChecks:
    """Known-answer, served-model and saturation checks on the endpoints probed here."""
    read: list[tuple[Config, dict[str, ClusterChecks]]] = []

    def settings() -> dict[str, ClusterChecks]:
        # Read again after a reload only: targets change far more often (discovery,
        # ownership), and each cluster's effective settings cost a validation.
        config = live.current
        if not read or read[0][0] is not config:
            read[:] = [(config, config.engine_checks())]
        return read[0][1]

    if catalog is None:
        return EngineChecks(control, live.current.probe_targets(), settings, clock, on_load)
    checks = EngineChecks(control, catalog.probed(catalog.targets()), settings, clock, on_load)
    catalog.on_targets(lambda targets: checks.set_targets(catalog.probed(targets)))
    return checks


def _remediation(
    config: Config, control: BoardKeeper, catalog: EndpointCatalog | None
) -> RemediationComponent:
    return RemediationComponent(
        config.remediation,
        config.limits,
        control,
        responsible=catalog.probes_here if catalog is not None else lambda _c, _a: True,
    )
