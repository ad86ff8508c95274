"""DNS discovery end to end (docs/design.md §11): a real DNS server on loopback (dnslib)
whose records the tests change while a real plugin process pushes to a real Envoy.

Simulated model servers listen on distinct loopback addresses (127.0.0.2, 127.0.0.3 ...)
sharing one port, as pods behind a headless Service do.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dns_server import LoopbackDns, loopback_dns
from tests.e2e.test_gateway import CLUSTER, FAST, envoy_view, stack  # noqa: F401
from tests.e2e.test_operate import cli
from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import PluginProcess

pytestmark = pytest.mark.envoy

NAME = "vllm-headless.llm.test"
REFRESH_S, HEALTHY_AFTER, INTERVAL_S, DRAIN_S = 1.0, 2, 1.0, 3.0
# The bound for a new record to be HEALTHY in Envoy, plus CI scheduling slack (the
# figure itself is measured by bench/discovery.py, not asserted here).
ADD_BOUND_S = REFRESH_S + HEALTHY_AFTER * INTERVAL_S + 1.0
SLACK_S = 2.0


@pytest.fixture
def dns() -> Iterator[LoopbackDns]:
    with loopback_dns() as server:
        yield server


def discovering_plugin(
    tmp_path: Path, dns: LoopbackDns, discovery: dict[str, Any], **cluster: Any
) -> PluginProcess:
    settings = {
        "probe": {
            "model": "sim-model",
            "healthy_after": HEALTHY_AFTER,
            "interval": f"{INTERVAL_S}s",
            "drain_time": f"{DRAIN_S}s",
        },
        "xds": {"warm_start_timeout": "5s"},
        "dns": {"nameservers": [dns.nameserver], "timeout": "500ms"},
        "clusters": [{"name": CLUSTER, "discovery": discovery, **cluster}],
    }
    return PluginProcess(tmp_path / "plugin", settings)


def rewrite(plugin: PluginProcess, mutate: Callable[[dict[str, Any]], None]) -> None:
    settings = yaml.safe_load(plugin.config_path.read_text())
    mutate(settings)
    plugin.config_path.write_text(yaml.safe_dump(settings, sort_keys=False))


MAX_USERS = 12


def stream_through(url: str, results: list[tuple[int, bool]], max_tokens: int) -> None:
    """One streamed completion through Envoy; appends (status, saw [DONE])."""
    body = json.dumps(
        {"model": "sim-model", "prompt": "hi", "max_tokens": max_tokens, "stream": True}
    ).encode()
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=20) as response:
            text = response.read().decode(errors="replace")
            results.append((int(response.status), "[DONE]" in text))
    except OSError:
        results.append((-1, False))


def test_a_records_come_and_go_without_cutting_requests(
    tmp_path: Path,
    dns: LoopbackDns,
    stack: Any,  # noqa: F811
) -> None:
    port = free_port()
    slow_stream = ("--ttft", "20ms", "--tpot", "20ms")  # 150 tokens: a 3 s stream
    a = stack.sim("a", *slow_stream, host="127.0.0.2", port=port)
    b = stack.sim("b", *slow_stream, host="127.0.0.3", port=port)
    for sim in (a, b):
        sim.wait_up()
    dns.set_a(NAME, ["127.0.0.2"])
    plugin = discovering_plugin(tmp_path, dns, {"dns": NAME, "port": port, "refresh": "1s"})
    stack_started(stack, plugin)
    plugin.start().wait_ready()
    envoy = stack.envoy(plugin).start()
    wait_until(lambda: envoy_view(envoy) == {a.address: ("HEALTHY", 100)}, 15, "a in Envoy")

    # A new record: in Envoy as STARTING (pushed UNHEALTHY), then HEALTHY.
    dns.set_a(NAME, ["127.0.0.2", "127.0.0.3"])
    seen: list[tuple[str, int] | None] = []

    def b_healthy() -> bool:
        seen.append(envoy_view(envoy).get(b.address))
        return seen[-1] == ("HEALTHY", 100)

    wait_until(b_healthy, ADD_BOUND_S + SLACK_S, "the new address HEALTHY in Envoy", interval=0.05)
    assert ("UNHEALTHY", 100) in seen, f"never seen STARTING (pushed UNHEALTHY) first: {seen}"
    added = [e for e in plugin.status()["clusters"][0]["endpoints"] if e["address"] == b.address]
    assert added and added[0]["state"] == "healthy"

    # Removed from DNS while users' streams run on it: DRAINING, the streams finish, gone.
    # Users start one after another until one streams from b (Envoy's balancer may put the
    # first ones on a), at most MAX_USERS of them.
    results: list[tuple[int, bool]] = []
    users: list[threading.Thread] = []

    def on_b() -> bool:
        if b.user_requests() >= 1:
            return True
        if len(users) < MAX_USERS:
            users.append(threading.Thread(target=stream_through, args=(envoy.url, results, 150)))
            users[-1].start()
        return False

    wait_until(on_b, 10, "a user stream on b", interval=0.25)
    dns.set_a(NAME, ["127.0.0.2"])
    wait_until(
        lambda: envoy_view(envoy).get(b.address, ("", 0))[0] == "DRAINING",
        REFRESH_S + 3,
        "b DRAINING in Envoy",
        interval=0.05,
    )
    for user in users:
        user.join(30)
    assert results == [(200, True)] * len(users), results
    wait_until(
        lambda: envoy_view(envoy) == {a.address: ("HEALTHY", 100)},
        DRAIN_S + REFRESH_S + 3,
        "b gone from Envoy after drain_time",
    )
    reasons = [r for r in plugin.log_records() if r.get("endpoint") == b.address]
    assert any(r.get("reason") == "gone from DNS" for r in reasons), reasons


def test_srv_ports_reload_and_operator_drain(
    tmp_path: Path,
    dns: LoopbackDns,
    stack: Any,  # noqa: F811
) -> None:
    a, b, c = (stack.sim(n, *FAST) for n in ("a", "b", "c"))
    for sim in (a, b, c):
        sim.wait_up()
    dns.set_a("a.llm.test", ["127.0.0.1"])
    dns.set_a("b.llm.test", ["127.0.0.1"])
    dns.set_a("c.llm.test", ["127.0.0.1"])
    dns.set_srv("_http._tcp.one.llm.test", [("a.llm.test", a.port), ("b.llm.test", b.port)])
    dns.set_srv("_http._tcp.two.llm.test", [("c.llm.test", c.port)])
    plugin = discovering_plugin(tmp_path, dns, {"srv": "_http._tcp.one.llm.test", "refresh": "1s"})
    stack_started(stack, plugin)
    plugin.start().wait_ready()
    envoy = stack.envoy(plugin).start()
    both = {a.address: ("HEALTHY", 100), b.address: ("HEALTHY", 100)}
    wait_until(lambda: envoy_view(envoy) == both, 15, "both SRV targets, on their own ports")

    # An operator action on a discovered endpoint works as on a configured one.
    admin = ("--admin", f"127.0.0.1:{plugin.grpc_port}")
    done = cli("drain", CLUSTER, a.address, *admin, "--reason", "kernel upgrade")
    assert done.returncode == 0, done.stderr
    wait_until(
        lambda: envoy_view(envoy).get(a.address) == ("DRAINING", 100), 5, "a drained by hand"
    )
    assert cli("undrain", CLUSTER, a.address, *admin).returncode == 0

    # Hot reload: the cluster follows another SRV name; the old targets drain out.
    def follow_two(settings: dict[str, Any]) -> None:
        settings["clusters"][0]["discovery"]["srv"] = "_http._tcp.two.llm.test"

    rewrite(plugin, follow_two)
    wait_until(
        lambda: envoy_view(envoy) == {c.address: ("HEALTHY", 100)},
        15,
        "only the new SRV target after reload and drain_time",
    )
    assert plugin.status()["reloads"]["applied"] >= 1


def test_dns_outage_changes_nothing_then_recovers(
    tmp_path: Path,
    dns: LoopbackDns,
    stack: Any,  # noqa: F811
) -> None:
    port = free_port()
    sims = [stack.sim(n, *FAST, host=f"127.0.0.{i}", port=port) for i, n in ((2, "a"), (3, "b"))]
    newcomer = stack.sim("c", *FAST, host="127.0.0.4", port=port)
    for sim in (*sims, newcomer):
        sim.wait_up()
    dns.set_a(NAME, ["127.0.0.2", "127.0.0.3"])
    plugin = discovering_plugin(tmp_path, dns, {"dns": NAME, "port": port, "refresh": "1s"})
    stack_started(stack, plugin)
    plugin.start().wait_ready()
    envoy = stack.envoy(plugin).start()
    healthy = {s.address: ("HEALTHY", 100) for s in sims}
    wait_until(lambda: envoy_view(envoy) == healthy, 15, "both in Envoy")
    states = plugin.states()

    def discovery() -> dict[str, Any]:
        found: dict[str, Any] = plugin.status()["discovery"]["clusters"][CLUSTER]
        return found

    views: list[dict[str, tuple[str, int]]] = []
    for mode in ("servfail", "drop"):  # two failed attempts of each kind, retried with back-off
        dns.set_mode(mode)
        failures = discovery()["failures"]
        deadline = time.monotonic() + 20  # back-off: 1 s, 2 s, 4 s, then 5 s (docs/design.md §11.3)
        while discovery()["failures"] < failures + 2:
            assert time.monotonic() < deadline, f"no two failed attempts ({mode}) within 20 s"
            views.append(envoy_view(envoy))
            assert plugin.states() == states
            time.sleep(0.1)
        assert discovery()["failing"] is True
        assert discovery()["endpoints"] == 2
    assert all(view == healthy for view in views), [v for v in views if v != healthy][:3]
    failed = [
        r for r in plugin.log_records() if r.get("msg", "").startswith("DNS discovery failed")
    ]
    assert len(failed) == 1, failed  # one line per outage, whatever the number of attempts
    assert failed[0]["fault"] == "servfail"

    # DNS back, with one more pod: seen within the back-off cap, then pushed.
    dns.set_mode("ok")
    dns.set_a(NAME, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
    want = {**healthy, newcomer.address: ("HEALTHY", 100)}
    wait_until(lambda: envoy_view(envoy) == want, 20, "the new pod after DNS recovered")
    assert discovery()["failing"] is False and discovery()["failures"] >= 2


def stack_started(procs: Any, plugin: PluginProcess) -> None:
    """Hand a plugin built here to the stack fixture, which stops it at teardown."""
    procs.adopt(plugin)
