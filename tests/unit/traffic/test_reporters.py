"""Who may degrade an endpoint through the access logs (docs/design.md §15.1): entries
count only from node ids holding an xDS stream, and unauthenticated quality limits stay
within the board's cap on outside reports (``Board.report``)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2

from llm_health.config import Config, parse_config
from llm_health.model.board import Board
from llm_health.model.states import State
from llm_health.traffic.component import TrafficComponent
from llm_health.traffic.entries import Request
from llm_health.traffic.stream import LogStreams
from tests.fakes import Clock, FakeControl

CONFIG = """
clusters:
  - name: solo
    endpoints: [{address: "127.0.0.1:9001"}]
  - name: trio
    endpoints: [{address: "127.0.0.1:9001"}, {address: "127.0.0.1:9002"},
                {address: "127.0.0.1:9003"}]
probe:
  quality: {window: 10s, min_requests: 10, max_error_rate: 0.1}
"""
TRIO = ["127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"]


def http_500() -> accesslog_pb2.HTTPAccessLogEntry:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    common = entry.common_properties
    common.upstream_cluster = "trio"
    common.upstream_remote_address.socket_address.address = "127.0.0.1"
    common.upstream_remote_address.socket_address.port_value = 9001
    common.duration.FromMilliseconds(40)
    entry.response.response_code.value = 500
    return entry


async def stream_of(node: str, batches: int, per_batch: int = 10) -> AsyncIterator[Any]:
    """As Envoy: the identifier in the first message only."""
    for index in range(batches):
        message = als_pb2.StreamAccessLogsMessage()
        if index == 0:
            message.identifier.node.id = node
        message.http_logs.log_entry.extend([http_500()] * per_batch)
        yield message


# --- the stream --------------------------------------------------------------------------


async def test_entries_of_a_node_without_an_xds_stream_are_counted_never_decoded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[Request] = []
    streams = LogStreams(lambda r, _n: seen.append(r), lambda: 0.0, xds_open={"gw-1"}.__contains__)
    with caplog.at_level(logging.INFO):
        await streams.consume(stream_of("forged\n\x1b[31m", 3), "ipv4:127.0.0.1:1")
        await streams.consume(stream_of("forged\n\x1b[31m", 3), "ipv4:127.0.0.1:2")
        await streams.consume(stream_of("", 1), "ipv4:127.0.0.1:3")  # no identifier at all
    assert seen == []
    stats = streams.stats
    assert stats.without_xds_total == 70 and stats.entries_total == 70
    assert stats.counted_total == 0
    lines = [r.getMessage() for r in caplog.records if "holds no xDS stream" in r.getMessage()]
    assert len(lines) == 2, lines  # once per node
    assert "\x1b" not in caplog.text and "\n" not in lines[0]
    await streams.consume(stream_of("gw-1", 2), "ipv4:127.0.0.1:4")
    assert len(seen) == 20 and stats.counted_total == 20


async def test_a_node_that_closes_its_xds_stream_stops_counting() -> None:
    open_nodes = {"gw-1"}
    seen: list[Request] = []
    streams = LogStreams(
        lambda r, _n: seen.append(r), lambda: 0.0, xds_open=open_nodes.__contains__
    )

    async def messages() -> AsyncIterator[Any]:
        async for message in stream_of("gw-1", 4):
            yield message
            open_nodes.discard("gw-1")  # after the first batch

    await streams.consume(messages(), "peer")
    assert len(seen) == 10 and streams.stats.without_xds_total == 30


# --- the cap -----------------------------------------------------------------------------


@pytest.fixture
def config() -> Config:
    return parse_config(CONFIG, "test.yaml", {})


def component(config: Config, *, authenticated: bool) -> tuple[TrafficComponent, FakeControl]:
    clock = Clock()
    board = Board(config.cluster_specs(), clock(), time.time() - clock())
    fake = FakeControl(board, clock)
    targets = config.probe_targets()
    traffic = TrafficComponent(
        fake, config.traffic_settings, targets, clock, authenticated=authenticated
    )
    traffic.set_probed(targets)
    for target in targets:
        while board.health(target.cluster, target.address).state is not State.HEALTHY:
            board.record(target.cluster, target.address, fake.probe_result, clock())
    return traffic, fake


def fail(traffic: TrafficComponent, fake: FakeControl, cluster: str, address: str) -> None:
    for _ in range(20):
        traffic.record(Request(cluster, address, 500, True, 0.05, None, 1, ()), fake.clock())


def degraded(fake: FakeControl, cluster: str) -> list[str]:
    endpoints = fake.board.snapshot().clusters[cluster].endpoints
    return [e.spec.address for e in endpoints if e.state is State.DEGRADED]


async def test_unauthenticated_limits_stay_within_the_cap(
    config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    traffic, fake = component(config, authenticated=False)
    fail(traffic, fake, "solo", "127.0.0.1:9001")
    for address in TRIO:
        fail(traffic, fake, "trio", address)
    with caplog.at_level(logging.INFO):
        await traffic.judge()
        await traffic.judge()  # held ones are tried again, logged once
    assert degraded(fake, "solo") == []  # 1 endpoint: never
    assert len(degraded(fake, "trio")) == 1  # floor(3 × 50 %)
    status = traffic.status()
    assert status["held_now"] == 3 and status["held_total"] == 3 and status["limited_now"] == 1
    held = [r for r in caplog.records if r.getMessage().startswith("traffic quality held")]
    assert len(held) == 3


async def test_a_held_limit_applies_once_there_is_room(config: Config) -> None:
    traffic, fake = component(config, authenticated=False)
    for address in TRIO[:2]:
        fail(traffic, fake, "trio", address)
    await traffic.judge()
    (first,) = degraded(fake, "trio")
    assert isinstance(fake.clock, Clock)
    fake.clock.now += 11  # the window (10 s) forgets everything
    (other,) = [a for a in TRIO[:2] if a != first]
    fail(traffic, fake, "trio", other)
    await traffic.judge()  # first's limit lifts, other's applies in the same round
    snapshot = {e.spec.address: e for e in fake.board.snapshot().clusters["trio"].endpoints}
    assert set(snapshot[other].limits) == {"quality"}
    assert not snapshot[first].limits and traffic.status()["held_now"] == 0


async def test_authenticated_limits_are_not_capped(config: Config) -> None:
    traffic, fake = component(config, authenticated=True)
    fail(traffic, fake, "solo", "127.0.0.1:9001")
    for address in TRIO:
        fail(traffic, fake, "trio", address)
    await traffic.judge()
    assert degraded(fake, "solo") == ["127.0.0.1:9001"]
    assert len(degraded(fake, "trio")) == 3
    assert traffic.status()["held_now"] == 0


# --- admission evidence (docs/design.md §3.5) ---------------------------------------------


def served(traffic: TrafficComponent, fake: FakeControl, address: str) -> None:
    """A real request that took 2 s, its first byte after 1.5 s of it."""
    traffic.record(Request("trio", address, 200, False, 2.0, 1.5, 1, ()), fake.clock())


@pytest.mark.parametrize("authenticated", [True, False])
def test_a_real_first_token_is_admission_evidence_only_from_authenticated_reporters(
    config: Config, authenticated: bool
) -> None:
    """Unauthenticated, a forged entry could hold a hung engine in rotation."""
    traffic, fake = component(config, authenticated=authenticated)
    served(traffic, fake, TRIO[0])
    token = fake.board.admission("trio", TRIO[0]).first_token_at
    if authenticated:
        assert token == pytest.approx(fake.clock() - 0.5)
    else:
        assert token is None


def test_failed_and_first_byte_less_requests_are_no_evidence(config: Config) -> None:
    traffic, fake = component(config, authenticated=True)
    traffic.record(Request("trio", TRIO[1], 503, True, 2.0, 1.5, 1, ()), fake.clock())
    traffic.record(Request("trio", TRIO[1], 0, False, 2.0, None, 1, ()), fake.clock())
    assert fake.board.admission("trio", TRIO[1]).first_token_at is None
