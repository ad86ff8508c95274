"""HDS over real gRPC, in process: a grpc.aio server on 127.0.0.1:0 serving
``HealthDiscoveryService`` from ``HdsService``, and client streams that play scripted
Envoy messages (good, empty, malformed, out of order, reconnecting). The service runs on
a fake clock so report TTL and first-check grace are exact.

The component (``llm_health.hds.component``) is tested against a real Runtime's board at the end:
verdicts become the board's "hds" signal, and go away again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.config.core.v3 import health_check_pb2
from envoy.service.health.v3 import hds_pb2, hds_pb2_grpc

from llm_health.app.assemble import build_runtime
from llm_health.config import parse_config
from llm_health.hds.component import endpoints_of
from llm_health.hds.fleet import ReportEntry
from llm_health.hds.ledger import Said
from llm_health.hds.service import HdsService
from llm_health.hds.settings import HdsConfig
from llm_health.model.board import ClusterSpec
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.states import State
from llm_health.servers.grpc import start_grpc_server
from llm_health.servers.hds import add_hds_servicer
from tests.configs import plugin_yaml
from tests.grpc_stream import ScriptedStream
from tests.polling import wait_until_async

pytestmark = pytest.mark.timeout(30)

SILENCE_S = 0.3
WAIT_S = 3.0  # for the server to catch up with what a client stream did
ENDPOINTS = {("llama", f"10.0.0.{i}:8000"): (f"10.0.0.{i}", 8000) for i in range(1, 5)}
METHOD = "/envoy.service.health.v3.HealthDiscoveryService/StreamHealthCheck"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Plugin:
    def __init__(self, service: HdsService, channel: grpc.aio.Channel, clock: Clock) -> None:
        self.service, self.channel, self.clock = service, channel, clock
        self.changes = 0

    def stream(self) -> Stream:
        return Stream(hds_pb2_grpc.HealthDiscoveryServiceStub(self.channel).StreamHealthCheck)


async def serve(settings: HdsConfig) -> AsyncIterator[Plugin]:
    clock = Clock()
    plugin: Plugin | None = None

    def changed() -> None:
        if plugin is not None:
            plugin.changes += 1

    service = HdsService(settings, endpoints=ENDPOINTS, clock=clock, on_change=changed)
    server, port = await start_grpc_server("127.0.0.1:0")
    add_hds_servicer(server, service)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            plugin = Plugin(service, channel, clock)
            yield plugin
    finally:
        await server.stop(0)


@pytest.fixture
async def plugin() -> AsyncIterator[Plugin]:
    async for running in serve(HdsConfig(checkers_per_endpoint=1)):
        yield running


class Stream(ScriptedStream):
    """One client stream of HDS messages (see ScriptedStream)."""

    silence_s = SILENCE_S


def hello(node: str, *protocols: int) -> hds_pb2.HealthCheckRequestOrEndpointHealthResponse:
    message = hds_pb2.HealthCheckRequestOrEndpointHealthResponse()
    request = message.health_check_request
    request.node.id = node
    request.capability.health_check_protocols.extend(
        protocols or (hds_pb2.Capability.HTTP, hds_pb2.Capability.TCP)
    )
    return message


def report(
    *entries: tuple[str, int, int], cluster: str | None = "hds_llama", flat: bool = True
) -> hds_pb2.HealthCheckRequestOrEndpointHealthResponse:
    """Envoy's shape: per cluster/locality and (``flat``) the same entries flat."""
    message = hds_pb2.HealthCheckRequestOrEndpointHealthResponse()
    response = message.endpoint_health_response
    response.SetInParent()  # as Envoy: set even when there is nothing to report
    locality = None
    if cluster is not None and entries:
        locality = response.cluster_endpoints_health.add(cluster_name=cluster)
        locality = locality.locality_endpoints_health.add()
    for host, port, status in entries:
        health = hds_pb2.EndpointHealth(health_status=status)  # type: ignore[arg-type]
        health.endpoint.address.socket_address.address = host
        health.endpoint.address.socket_address.port_value = port
        if locality is not None:
            locality.endpoints_health.append(health)
        if flat:
            response.endpoints_health.append(health)
    return message


def targets(specifier: hds_pb2.HealthCheckSpecifier) -> set[tuple[str, str, int]]:
    return {
        (c.cluster_name, e.address.socket_address.address, e.address.socket_address.port_value)
        for c in specifier.cluster_health_checks
        for locality in c.locality_endpoints
        for e in locality.endpoints
    }


ALL = {("hds_llama", f"10.0.0.{i}", 8000) for i in range(1, 5)}
DOWN, UP = health_check_pb2.UNHEALTHY, health_check_pb2.HEALTHY


# --------------------------------------------------------------------------- tests


async def test_each_node_gets_its_share_and_the_rest_when_the_other_leaves(
    plugin: Plugin,
) -> None:
    one, two = plugin.stream(), plugin.stream()
    one.send(hello("gw-1"))
    assert targets(await one.recv()) == ALL  # alone: everything
    two.send(hello("gw-2"))
    share_two = targets(await two.recv())
    share_one = targets(await one.recv())  # re-sent: its plan changed
    assert share_one | share_two == ALL and not share_one & share_two
    assert share_one and share_two  # rendezvous over 4 endpoints gives each some here
    await one.silent()
    await two.close()
    assert targets(await one.recv()) == ALL
    await one.close()
    await wait_until_async(
        lambda: plugin.service.stats.streams_open == 0,
        WAIT_S,
        "stats.streams_open == 0",
    )
    assert plugin.service.fleet.nodes() == ()


async def test_a_node_with_nothing_assigned_gets_an_empty_specifier(plugin: Plugin) -> None:
    plugin.service.set_endpoints({("llama", "10.0.0.1:8000"): ("10.0.0.1", 8000)})
    streams = [plugin.stream() for _ in range(3)]
    for index, stream in enumerate(streams):
        stream.send(hello(f"gw-{index}"))
        await stream.recv()  # everyone is answered at once
    await wait_until_async(
        lambda: len(plugin.service.fleet.nodes()) == 3,
        WAIT_S,
        "len(plugin.service.fleet.nodes()) == 3",
    )
    await asyncio.sleep(SILENCE_S)
    latest = [stream.last for stream in streams]
    assert sorted(len(targets(s)) for s in latest) == [0, 0, 1]
    assert all(s.interval.ToMilliseconds() == 1000 for s in latest)
    for stream in streams:
        await stream.close()


async def test_the_specifier_is_resent_on_every_request_and_never_for_a_report(
    plugin: Plugin,
) -> None:
    stream = plugin.stream()
    stream.send(hello("gw-1"))
    first = await stream.recv()
    stream.send(report(("10.0.0.1", 8000, UP)))
    await stream.silent()
    stream.send(hello("gw-1"))  # e.g. a client that re-identifies: answered again
    assert await stream.recv() == first
    await stream.close()


async def test_bad_messages_never_end_the_stream_or_corrupt_state(plugin: Plugin) -> None:
    stats = plugin.service.stats
    stream = plugin.stream()
    stream.send(hds_pb2.HealthCheckRequestOrEndpointHealthResponse())  # neither field
    stream.send(report(("10.0.0.1", 8000, DOWN)))  # before the HealthCheckRequest
    stream.send(hello("gw-1"))
    await stream.recv()
    plugin.clock.now += 10  # past the first-check grace
    bad = report(
        ("10.9.9.9", 8000, DOWN),  # not an endpoint of ours
        ("10.0.0.1", 0, DOWN),  # no port
        ("", 8000, DOWN),  # no address
        ("10.0.0.2", 8000, 42),  # an unknown status value
    )
    pipe = bad.endpoint_health_response.cluster_endpoints_health[0]
    pipe.locality_endpoints_health[0].endpoints_health.add().endpoint.address.pipe.path = "/x"
    foreign = bad.endpoint_health_response.cluster_endpoints_health.add(cluster_name="other")
    foreign.locality_endpoints_health.add().endpoints_health.add()
    stream.send(bad)
    stream.send(report())  # empty: a sign of life, nothing else
    stream.send(report(("10.0.0.3", 8000, DOWN), cluster=None))  # flat form only
    await wait_until_async(lambda: stats.reports == 3, WAIT_S, "stats.reports == 3")
    assert stats.empty_messages == 1
    assert stats.reports_before_request == 1
    assert stats.empty_reports == 1
    assert stats.malformed_entries == 4  # no port, no address, pipe, foreign cluster
    assert stats.entries.unknown_endpoint == 1
    assert stats.entries.no_verdict == 1
    assert stats.entries.counted == 1
    decisions = plugin.service.decisions()
    assert decisions[("llama", "10.0.0.3:8000")] == "unreachable from gw-1"
    assert [k for k, v in decisions.items() if v] == [("llama", "10.0.0.3:8000")]
    # Still serving: a healthy report lifts it.
    stream.send(report(("10.0.0.3", 8000, UP)))
    await wait_until_async(
        lambda: plugin.service.decisions()[("llama", "10.0.0.3:8000")] is None,
        WAIT_S,
        "decisions()[('llama', '10.0.0.3:8000')] is None",
    )
    await stream.close()


async def test_an_empty_message_after_the_request_is_envoys_empty_report(
    plugin: Plugin,
) -> None:
    """Envoy with nothing to check reports a message with neither field set; it must
    count as a report and keep the node from going stale."""
    stream = plugin.stream()
    stream.send(hello("gw-1"))
    await stream.recv()
    for _ in range(3):
        plugin.clock.now += 2  # 6 s in all: more than report_ttl (5 s) since the request
        stream.send(hds_pb2.HealthCheckRequestOrEndpointHealthResponse())
        await wait_until_async(
            lambda: plugin.service.stats.empty_reports >= 1,
            WAIT_S,
            "stats.empty_reports >= 1",
        )
        plugin.service.tick()
    await wait_until_async(
        lambda: plugin.service.stats.empty_reports == 3,
        WAIT_S,
        "stats.empty_reports == 3",
    )
    (node,) = plugin.service.fleet.nodes()
    assert node.reports == 3 and plugin.service.fleet.usable(node)
    assert plugin.service.stats.empty_messages == 0
    await stream.silent()  # still assigned the same: nothing re-sent
    await stream.close()


async def test_garbage_bytes_end_only_that_stream(plugin: Plugin) -> None:
    raw = plugin.channel.stream_stream(
        METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )

    async def garbage() -> AsyncIterator[bytes]:
        yield b"\xff\xfe not a protobuf \x00\x01"
        await asyncio.sleep(5)

    call = raw(garbage())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert plugin.service.stats.undecodable_messages == 1
    stream = plugin.stream()
    stream.send(hello("gw-1"))
    assert targets(await stream.recv()) == ALL
    await stream.close()


async def test_a_node_that_reconnects_at_once_keeps_its_assignment(plugin: Plugin) -> None:
    other = plugin.stream()
    other.send(hello("gw-2"))
    await other.recv()
    old = plugin.stream()
    old.send(hello("gw-1"))
    mine = targets(await old.recv())
    theirs = targets(await other.recv())
    assert mine | theirs == ALL
    plugin.clock.now += 10
    old.send(report(*[(h, p, DOWN) for _, h, p in sorted(mine)]))
    await wait_until_async(lambda: plugin.service.stats.reports == 1, WAIT_S, "stats.reports == 1")
    new = plugin.stream()  # same node id, before the old stream is gone
    new.send(hello("gw-1"))
    assert targets(await new.recv()) == mine
    await old.close()
    await wait_until_async(
        lambda: plugin.service.stats.streams_open == 2,
        WAIT_S,
        "stats.streams_open == 2",
    )
    await other.silent()  # nothing moved: gw-1 never left
    await new.silent()
    (node,) = [n for n in plugin.service.fleet.nodes() if n.node_id == "gw-1"]
    assert len(node.streams) == 1
    # Its reports were kept across the reconnect.
    down = {k for k, v in plugin.service.decisions().items() if v}
    assert {address.split(":")[0] for _, address in down} == {h for _, h, _ in mine}
    await new.close()
    await other.close()


@pytest.fixture
async def pair_plugin() -> AsyncIterator[Plugin]:
    async for running in serve(HdsConfig(checkers_per_endpoint=2, report_ttl="5s")):
        yield running


async def test_reports_of_a_node_that_went_away_expire(pair_plugin: Plugin) -> None:
    plugin, key = pair_plugin, ("llama", "10.0.0.1:8000")
    one, two = plugin.stream(), plugin.stream()
    one.send(hello("gw-1"))
    two.send(hello("gw-2"))
    await one.recv()
    await two.recv()
    plugin.clock.now += 10
    one.send(report(("10.0.0.1", 8000, DOWN)))
    two.send(report(("10.0.0.1", 8000, UP)))
    await wait_until_async(lambda: plugin.service.stats.reports == 2, WAIT_S, "stats.reports == 2")
    assert plugin.service.decisions()[key] is None  # 1 of 2: no majority
    await two.close()
    await wait_until_async(
        lambda: plugin.service.stats.streams_open == 1,
        WAIT_S,
        "stats.streams_open == 1",
    )
    for second in range(1, 7):  # gw-1 goes on reporting every second, as Envoy does
        plugin.clock.now += 1
        plugin.service.tick()
        one.send(report(("10.0.0.1", 8000, DOWN)))
        await wait_until_async(
            lambda expected=2 + second: plugin.service.stats.reports == expected,
            WAIT_S,
            f"stats.reports == {2 + second}",
        )
        verdict = plugin.service.decisions()[key]
        if second <= 5:
            assert verdict is None, second  # gw-2's last word (UP) still counts
        else:
            assert verdict == "unreachable from gw-1"
    status = plugin.service.status()
    (entry,) = [e for e in status["endpoints"] if e["address"] == "10.0.0.1:8000"]
    assert entry["reporters"] == [
        {"node": "gw-1", "said": "unhealthy", "age_s": 0.0, "assigned": True}
    ]
    assert entry["checkers"] == ["gw-1"]
    await one.close()


async def test_disabled_hds_refuses_streams() -> None:
    async for plugin in serve(HdsConfig(enabled=False)):
        call = hds_pb2_grpc.HealthDiscoveryServiceStub(plugin.channel).StreamHealthCheck(
            iter([hello("gw-1")])
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "hds.enabled" in str(caught.value.details())
        assert plugin.service.stats.refused_streams == 1


# --------------------------------------------------------------------------- component

CONFIG = plugin_yaml(
    ["10.0.0.1:8000", "10.0.0.2:8000"], listen=False, hds={"checkers_per_endpoint": 1}
)


async def test_component_sets_and_clears_the_boards_hds_signal() -> None:
    clock = Clock()
    runtime = build_runtime(parse_config(CONFIG, "x.yaml", {}), clock=clock)
    (component,) = [c for c in runtime.components if c.name == "hds"]
    seen: list[tuple[str, str, str]] = []
    runtime.control.on_transition(
        lambda cluster, address, t, _r: seen.append((address, t.from_state.value, t.after.reason))
    )
    fast = ProbeResult(Outcome.FAST, 0.0, ttft_ms=10)
    for address in ("10.0.0.1:8000", "10.0.0.2:8000"):
        runtime.control.board.record("llama", address, fast, clock.now)
    assert runtime.control.board.health("llama", "10.0.0.1:8000").state is State.HEALTHY

    fleet = component.service.fleet  # type: ignore[attr-defined]
    fleet.open_stream(1, "gw-1", ["TCP"], clock.now)
    clock.now += 10
    fleet.report(1, [ReportEntry("llama", "10.0.0.1", 8000, Said.UNHEALTHY)], clock.now)
    await component.sync()  # type: ignore[attr-defined]
    endpoint = runtime.control.published().clusters["llama"].endpoints[0]
    assert endpoint.state is State.UNHEALTHY
    assert endpoint.reason == "unreachable from gw-1"
    assert dict(endpoint.signals) == {"hds": "unreachable from gw-1"}
    assert seen == [("10.0.0.1:8000", "healthy", "unreachable from gw-1")]
    revision = runtime.control.published().revision
    await component.sync()  # nothing changed: no board write, no publish
    assert runtime.control.published().revision == revision

    fleet.report(1, [ReportEntry("llama", "10.0.0.1", 8000, Said.HEALTHY)], clock.now)
    await component.sync()
    endpoint = runtime.control.published().clusters["llama"].endpoints[0]
    assert dict(endpoint.signals) == {}
    assert endpoint.state is State.UNHEALTHY  # recovery goes through probe hysteresis
    for _ in range(3):  # healthy_after = 3 FAST probes
        runtime.control.board.record("llama", "10.0.0.1:8000", fast, clock.now)
    assert runtime.control.board.health("llama", "10.0.0.1:8000").state is State.HEALTHY
    assert component.status()["nodes"][0]["node"] == "gw-1"


# --------------------------------------------------------------------------- engine


async def scripted(
    *messages: hds_pb2.HealthCheckRequestOrEndpointHealthResponse, end: asyncio.Event
) -> AsyncIterator[hds_pb2.HealthCheckRequestOrEndpointHealthResponse]:
    for message in messages:
        yield message
    await end.wait()  # the peer vanishes when ``end`` is set


async def test_a_vanished_peer_leaves_even_if_the_stream_is_never_resumed() -> None:
    """Seen with a SIGKILLed Envoy under CPU load: gRPC dropped the response generator
    while it was suspended, so its ``finally`` did not run; the node must leave when the
    request side ends, not when (or if) the generator is finalised."""
    service = HdsService(HdsConfig(), endpoints=ENDPOINTS)
    end = asyncio.Event()
    stream = service.stream(scripted(hello("gw-1"), end=end))
    await anext(stream)  # the first specifier; the generator now sits at its yield
    assert [n.node_id for n in service.fleet.nodes()] == ["gw-1"]
    end.set()
    await wait_until_async(
        lambda: service.fleet.nodes() == (), WAIT_S, "service.fleet.nodes() == ()"
    )
    assert service.stats.streams_open == 0
    await stream.aclose()  # finalising later is harmless (idempotent)
    assert service.stats.streams_open == 0


async def test_a_stream_changing_its_node_id_at_every_message_logs_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """1,000 requests naming a new node id each, on one stream: ignored, one line."""
    service = HdsService(HdsConfig(), endpoints=ENDPOINTS)
    end = asyncio.Event()
    renamed = [hello(f"gw-{n}") for n in range(1, 1_001)]
    caplog.set_level(logging.WARNING, logger="llm_health.hds")
    stream = service.stream(scripted(hello("gw-0"), *renamed, end=end))
    await anext(stream)
    await wait_until_async(
        lambda: service.stats.health_check_requests == 1_001, WAIT_S, "every request read"
    )
    end.set()
    await stream.aclose()
    lines = [r.getMessage() for r in caplog.records if "sent node id" in r.getMessage()]
    assert lines == ["HDS stream of gw-0 sent node id 'gw-1': ignored"]
    assert [n.node_id for n in service.fleet.nodes()] == []


async def test_a_second_cancellation_cannot_skip_leaving() -> None:
    service = HdsService(HdsConfig(), endpoints=ENDPOINTS)
    end = asyncio.Event()

    async def consume() -> None:
        async for _ in service.stream(scripted(hello("gw-1"), end=end)):
            pass

    task = asyncio.create_task(consume())
    await wait_until_async(
        lambda: len(service.fleet.nodes()) == 1, WAIT_S, "len(service.fleet.nodes()) == 1"
    )
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait([task])
    assert service.fleet.nodes() == ()
    assert service.stats.streams_open == 0


async def test_endpoint_changes_are_sent_once(plugin: Plugin) -> None:
    stream = plugin.stream()
    stream.send(hello("gw-1"))
    assert targets(await stream.recv()) == ALL
    fewer = {k: v for k, v in ENDPOINTS.items() if k[1] != "10.0.0.4:8000"}
    plugin.service.set_endpoints(fewer)
    assert targets(await stream.recv()) == ALL - {("hds_llama", "10.0.0.4", 8000)}
    plugin.service.set_endpoints(dict(fewer))  # the same set again: nothing to send
    await stream.silent()
    await stream.close()


def test_endpoints_being_removed_by_a_reload_are_not_checked() -> None:
    runtime = build_runtime(parse_config(CONFIG, "x.yaml", {}))
    assert set(endpoints_of(runtime.control.board.snapshot())) == {
        ("llama", "10.0.0.1:8000"),
        ("llama", "10.0.0.2:8000"),
    }
    (spec,) = runtime.control.board.snapshot().clusters.values()
    kept = ClusterSpec("llama", runtime.control.board.policy("llama"), (spec.endpoints[0].spec,))
    runtime.control.board.apply_specs([kept], now=1.0)
    assert endpoints_of(runtime.control.board.snapshot()) == {
        ("llama", "10.0.0.1:8000"): ("10.0.0.1", 8000)
    }
