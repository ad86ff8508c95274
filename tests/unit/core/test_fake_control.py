"""Components work on any ``BoardControl``: built here on ``tests.fakes.FakeControl``
behind a proxy that answers only the protocol's names, so a component that reached for
the keeper (``.board``, ``.hub``, ``.stats``) or the runtime fails here (docs/design.md
§8.2: components get a BoardControl, never the keeper)."""

from __future__ import annotations

import inspect
import time
from typing import Any

import pytest

from llm_health.admin.component import AdminComponent
from llm_health.alerts.component import attach as attach_alerts
from llm_health.config import Config, parse_config
from llm_health.core.control import BoardControl
from llm_health.engines.component import EngineChecks
from llm_health.fleet.component import FleetComponent
from llm_health.hds.component import HdsComponent
from llm_health.model.board import Board
from llm_health.model.states import State
from llm_health.remediation.component import RemediationComponent
from llm_health.traffic.component import TrafficComponent
from llm_health.traffic.entries import Request
from tests.fakes import Clock, FakeControl

CONFIG = """
clusters:
  - name: pool
    endpoints: [{address: "127.0.0.1:9001"}, {address: "127.0.0.1:9002"}]
probe:
  quality: {window: 10s, min_requests: 10, max_error_rate: 0.1}
alerts:
  webhooks: [{url: "http://127.0.0.1:9/hook"}]
fleet:
  redis: redis://127.0.0.1:9/0
  name: test
remediation:
  - when: {state: unhealthy, for: 1s}
    run: ["/bin/true"]
"""

PROTOCOL = {
    name
    for name, member in inspect.getmembers(BoardControl)
    if not name.startswith("_") and callable(member)
}


class ProtocolOnly:
    """Lets through exactly the names ``BoardControl`` declares."""

    def __init__(self, inner: FakeControl) -> None:
        self._inner = inner
        self.used: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        if name not in PROTOCOL:
            raise AttributeError(f"{name!r} is not part of BoardControl")
        self.used.add(name)
        return getattr(self._inner, name)


class Routing:
    """The fleet's view of the endpoint catalog (``fleet.component.ProbeRouting``)."""

    def on_targets(self, follow: Any) -> None:
        self.follow = follow

    def refilter(self) -> None:
        pass


@pytest.fixture
def config() -> Config:
    return parse_config(CONFIG, "test.yaml", {})


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(config: Config, clock: Clock) -> FakeControl:
    board = Board(config.cluster_specs(), clock(), time.time() - clock())
    return FakeControl(board, clock)


def test_the_fake_implements_every_protocol_method_with_its_parameters() -> None:
    assert {"snapshot", "update", "notify", "probe_now", "probe_state"} <= PROTOCOL
    for name in PROTOCOL:
        declared = inspect.signature(getattr(BoardControl, name))
        written = inspect.signature(getattr(FakeControl, name))
        assert list(written.parameters) == list(declared.parameters), name


def test_the_proxy_refuses_what_the_protocol_does_not_have(fake: FakeControl) -> None:
    control = ProtocolOnly(fake)
    with pytest.raises(AttributeError, match="board"):
        _ = control.board
    assert control.snapshot() is not None


async def test_traffic_quality_degrades_through_the_control(
    config: Config, fake: FakeControl, clock: Clock
) -> None:
    control = ProtocolOnly(fake)
    targets = config.probe_targets()
    traffic = TrafficComponent(control, config.traffic_settings, targets, clock)  # type: ignore[arg-type]
    traffic.set_probed(targets)
    for address in ("127.0.0.1:9001", "127.0.0.1:9002"):
        while fake.board.health("pool", address).state is not State.HEALTHY:
            fake.board.record("pool", address, fake.probe_result, clock())
    for _ in range(20):
        traffic.record(Request("pool", "127.0.0.1:9001", 503, True, 0.05, None, 1, ()), clock())
    before = len(fake.published_snapshots)
    await traffic.judge()
    assert fake.board.health("pool", "127.0.0.1:9001").state is State.DEGRADED
    assert fake.board.health("pool", "127.0.0.1:9002").state is not State.DEGRADED
    assert len(fake.published_snapshots) > before
    assert "update" in control.used
    assert traffic.status()["endpoints"]["pool/127.0.0.1:9001"]["limited"]


def test_alerts_subscribe_through_the_control(config: Config, fake: FakeControl) -> None:
    alerts = attach_alerts(config.alerts, ProtocolOnly(fake))  # type: ignore[arg-type]
    assert alerts.observe in fake.transition_observers
    assert alerts.observe_notice in fake.notice_observers


def test_every_other_component_builds_and_reports_on_the_protocol_alone(
    config: Config, fake: FakeControl, clock: Clock
) -> None:
    control: Any = ProtocolOnly(fake)
    targets = config.probe_targets()
    components = [
        HdsComponent(config.hds, control, clock),
        AdminComponent(config.admin, config.server.grpc, control),
        RemediationComponent(config.remediation, config.limits, control, clock=clock),
        EngineChecks(control, targets, config.engine_checks, clock),
        FleetComponent(config.fleet, "me", control, Routing()),  # type: ignore[arg-type]
    ]
    for component in components:
        assert isinstance(component.status(), dict), component.name
        assert isinstance(component.tasks(), list), component.name


def test_remediation_reads_first_sight_and_policy_through_the_control(
    config: Config, fake: FakeControl, clock: Clock
) -> None:
    control = ProtocolOnly(fake)
    remediation = RemediationComponent(config.remediation, config.limits, control, clock=clock)  # type: ignore[arg-type]
    assert remediation.tick(fake.snapshot()) == []  # STARTING endpoints: nothing is due
    assert {"first_seen", "policy"} <= control.used
