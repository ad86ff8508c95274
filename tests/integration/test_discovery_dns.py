"""DNS discovery against a real DNS server on loopback (dnslib, tests/dns_server.py): the
resolver's answers and faults, the watcher's back-off and once-per-outage reports, and
the component following reloads into the board (docs/design.md §11)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from llm_health.app.assemble import build_runtime
from llm_health.config import parse_config
from llm_health.core.control import Notice
from llm_health.core.settings import MERGING
from llm_health.discovery.answers import DnsFault, FaultKind, Found
from llm_health.discovery.component import DiscoveryComponent
from llm_health.discovery.lookup import DnsLookup
from llm_health.discovery.settings import DiscoveryConfig, DnsConfig
from llm_health.discovery.watcher import Watcher
from llm_health.model.board import EndpointSpec
from llm_health.model.states import State
from tests.configs import plugin_yaml
from tests.dns_server import LoopbackDns, loopback_dns
from tests.polling import wait_until_async

NAME = "vllm.llm.test"


@pytest.fixture
def dns() -> Iterator[LoopbackDns]:
    with loopback_dns() as server:
        yield server


def lookup(dns: LoopbackDns, timeout: float = 0.5) -> DnsLookup:
    settings = {"nameservers": [f"127.0.0.1:{dns.port}"], "timeout": timeout}
    return DnsLookup(DnsConfig.model_validate(settings, context=MERGING))


def a_records(name: str = NAME, port: int = 8000, **more: Any) -> DiscoveryConfig:
    return DiscoveryConfig.model_validate({"dns": name, "port": port, **more}, context=MERGING)


def addresses(found: Found) -> list[str]:
    return [e.address for e in found.endpoints]


# --- the resolver -------------------------------------------------------------------------


async def test_a_and_aaaa_records(dns: LoopbackDns) -> None:
    dns.set_a(NAME, ["127.0.0.3", "127.0.0.2", "::1"], ttl=9)
    found = await lookup(dns).resolve(a_records())
    assert addresses(found) == ["127.0.0.2:8000", "127.0.0.3:8000", "[::1]:8000"]
    assert found.ttl == 9


async def test_srv_targets_with_their_ports(dns: LoopbackDns) -> None:
    dns.set_a("a.llm.test", ["127.0.0.5"])
    dns.set_a("b.llm.test", ["127.0.0.6", "127.0.0.7"])
    targets = [("a.llm.test", 9001), ("b.llm.test", 9002), ("missing.llm.test", 9003), (".", 1)]
    srv = DiscoveryConfig(srv="_http._tcp.vllm.llm.test")
    for glue in (True, False):  # addresses in the answer (CoreDNS), or asked target by target
        dns.set_srv("_http._tcp.vllm.llm.test", targets, glue=glue)
        before = dns.queries
        found = await lookup(dns).resolve(srv)
        # A target without an address (NXDOMAIN) and "." (RFC 2782: no service) are left out.
        assert addresses(found) == ["127.0.0.5:9001", "127.0.0.6:9002", "127.0.0.7:9002"]
        # With glue only the target without address is asked for (A and AAAA).
        assert dns.queries - before == (3 if glue else 7)


async def test_large_answer_over_tcp(dns: LoopbackDns) -> None:
    ips = [f"127.1.{i // 250}.{i % 250 + 1}" for i in range(500)]
    dns.set_a(NAME, ips)  # 8 KB: truncated over UDP, retried over TCP by dnspython
    found = await lookup(dns, timeout=2.0).resolve(a_records())
    assert len(found.endpoints) == 500
    capped = await lookup(dns, timeout=2.0).resolve(a_records(max_endpoints=100))
    assert len(capped.endpoints) == 100 and "400 addresses over" in capped.dropped[0]


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        ("servfail", FaultKind.SERVFAIL),
        ("refused", FaultKind.SERVFAIL),
        ("nxdomain", FaultKind.NXDOMAIN),
        ("drop", FaultKind.TIMEOUT),
    ],
)
async def test_faults(dns: LoopbackDns, mode: str, kind: FaultKind) -> None:
    dns.set_a(NAME, ["127.0.0.2"])
    dns.set_mode(mode)
    with pytest.raises(DnsFault) as info:
        await lookup(dns, timeout=0.3).resolve(a_records())
    assert info.value.kind is kind
    assert NAME in info.value.reason


async def test_name_without_address_is_empty_not_a_scale_to_zero(dns: LoopbackDns) -> None:
    dns.set_srv(NAME, [("x.llm.test", 80)])  # the name exists, with no A or AAAA
    with pytest.raises(DnsFault) as info:
        await lookup(dns).resolve(a_records())
    assert info.value.kind is FaultKind.EMPTY


# --- the watcher --------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.sets: list[tuple[EndpointSpec, ...]] = []
        self.faults: list[FaultKind | None] = []

    async def found(self, _cluster: str, endpoints: tuple[EndpointSpec, ...]) -> None:
        self.sets.append(endpoints)

    def fault(self, _cluster: str, fault: DnsFault | None) -> None:
        self.faults.append(None if fault is None else fault.kind)


async def test_watcher_keeps_the_set_through_an_outage_and_reports_once(dns: LoopbackDns) -> None:
    dns.set_a(NAME, ["127.0.0.2", "127.0.0.3"])
    seen = Recorder()
    watcher = Watcher("c", a_records(refresh=0.5), lookup(dns, 0.2).resolve, seen.found, seen.fault)
    task = asyncio.create_task(watcher.run())
    try:
        await wait_until_async(lambda: len(seen.sets) == 1, 5, "the first set")
        dns.set_mode("servfail")
        started = time.monotonic()
        await wait_until_async(lambda: watcher.stats.failures >= 3, 10, "three failed attempts")
        elapsed = time.monotonic() - started
        dns.set_mode("drop")  # the outage goes on, as timeouts now
        failed = watcher.stats.failures
        await wait_until_async(lambda: watcher.stats.failures > failed, 10, "a timed-out attempt")
        assert seen.sets == [seen.sets[0]]  # never emptied, never changed
        assert seen.faults == [FaultKind.SERVFAIL]  # one report for the whole outage
        assert watcher.status(time.time())["failing"] is True
        # Back-off: three attempts take longer than three refreshes' worth of retries at once.
        assert elapsed >= 0.5 + 1.0, elapsed
        dns.set_mode("ok")
        dns.set_a(NAME, ["127.0.0.2"])  # a scale-down in a good answer is real
        await wait_until_async(lambda: len(seen.sets) == 2, 10, "the recovery")
        assert seen.faults == [FaultKind.SERVFAIL, None]
        assert [e.address for e in seen.sets[1]] == ["127.0.0.2:8000"]
    finally:
        task.cancel()


async def test_watcher_turns_a_resolver_bug_into_a_fault() -> None:
    seen = Recorder()

    async def broken(_settings: DiscoveryConfig) -> Found:
        raise ZeroDivisionError

    watcher = Watcher("c", a_records(refresh=0.5), broken, seen.found, seen.fault)
    task = asyncio.create_task(watcher.run())
    try:
        await wait_until_async(lambda: seen.faults, 5, "the fault")
        assert seen.faults == [FaultKind.BAD_ANSWER]
        assert not task.done()
    finally:
        task.cancel()


# --- the component, into the board ------------------------------------------------------


def runtime_config(dns: LoopbackDns, discovery: dict[str, Any] | None = None) -> Any:
    """Cluster c: one endpoint configured, ``discovery`` (its section) for the rest."""
    hook = {"url": "http://127.0.0.1:9/hook", "on": ["discovery_failed", "discovery_recovered"]}
    text = plugin_yaml(
        ["127.0.0.9:8000"],
        cluster="c",
        cluster_keys={"discovery": discovery} if discovery else None,
        listen=False,
        dns={"nameservers": [dns.nameserver], "timeout": "300ms"},
        probe={"drain_time": "30s"},
        alerts={"webhooks": [hook]},
    )
    return parse_config(text, "t.yaml", {})


async def test_component_feeds_the_board_and_follows_reloads(dns: LoopbackDns) -> None:
    dns.set_a(NAME, ["127.0.0.2", "127.0.0.9"])  # .9 is also configured: one endpoint
    runtime = build_runtime(runtime_config(dns, {"dns": NAME, "port": 8000, "refresh": "500ms"}))
    component = next(c for c in runtime.components if isinstance(c, DiscoveryComponent))
    notices: list[Notice] = []
    runtime.control.on_notice(notices.append)
    task = asyncio.create_task(component.run())

    def board_addresses() -> set[str]:
        (cluster,) = runtime.control.snapshot().clusters.values()
        return {e.spec.address for e in cluster.endpoints if not e.removing}

    try:
        await wait_until_async(
            lambda: board_addresses() == {"127.0.0.2:8000", "127.0.0.9:8000"}, 5, "found"
        )
        assert {t.address for t in runtime.targets} == {"127.0.0.2:8000", "127.0.0.9:8000"}
        assert component.status()["clusters"]["c"]["endpoints"] == 2

        dns.set_mode("servfail")
        await wait_until_async(lambda: notices, 5, "the failure notice")
        assert [n.kind for n in notices] == ["discovery_failed"]
        assert "keeping the last known endpoints" in notices[0].reason
        assert board_addresses() == {"127.0.0.2:8000", "127.0.0.9:8000"}
        dns.set_mode("ok")
        await wait_until_async(lambda: len(notices) == 2, 10, "the recovery notice")
        assert notices[1].kind == "discovery_recovered"

        # Reload without discovery: what DNS gave drains out; the configured one stays.
        runtime.live.current = runtime_config(dns)
        await runtime.catalog.apply()
        await wait_until_async(lambda: board_addresses() == {"127.0.0.9:8000"}, 5, "forgotten")
        snapshot = runtime.control.snapshot().clusters["c"]
        drained = {e.spec.address: e.state for e in snapshot.endpoints if e.removing}
        assert drained == {"127.0.0.2:8000": State.DRAINING}
        await wait_until_async(lambda: component.status()["clusters"] == {}, 5, "no watcher")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
