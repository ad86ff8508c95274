"""Fleet mode (docs/design.md §12): N `llm-health serve` replicas sharing one probe per
backend through one Redis, against the same replicas as independent sidecars.

1. Load. For every endpoint count (``--endpoints``) and replica count (``--replicas``),
   interval 1 s: fresh replicas with ``fleet:`` (one Redis, heartbeat 1 s, member_ttl
   3 s), then fresh replicas without it (each probes every endpoint). The backends are
   ``llm-health sim`` processes serving up to 500 ports each, started once. Each row
   waits until every replica is ready (fleet: sharing, with all members; at most
   ``--start-limit`` s), until every replica's board shows every endpoint healthy (at
   most ``--settle`` s), ``--warmup`` s more, then measures ``--window`` s: probes the
   simulators counted (``/sim/stats`` ``probe_requests``), per backend and second; Redis
   commands from ``INFO`` deltas (``total_commands_processed``, less this script's own
   ``INFO`` calls, and the commands the replicas send themselves from ``commandstats``:
   EVALSHA, HSCAN, HMGET...; the rest run inside the Lua scripts); CPU of the replicas,
   the simulators, Redis and the whole machine from ``/proc``. Replicas run at nice 10
   (the simulators stand for GPU servers elsewhere). A row below 90 % of its schedule
   is marked overloaded; an independent row is not run once fewer independent replicas
   of the same size were already overloaded (``--run-overloaded`` runs it anyway).
2. Verdict propagation: 3 replicas, each with its own real Envoy (``sidecar-ads.yaml``),
   ``--backends`` simulators. ``--events`` times, in turn on each backend (after a random
   0..interval wait, so at a random phase of the probe schedule): ``cuda_error`` fault,
   then every Envoy's admin ``/clusters`` polled every 5 ms (one thread per Envoy) until
   it shows the backend UNHEALTHY; the fault is then cleared and the backend recovers
   while the next ones are tested. Latency = that moment at each non-owner replica's
   Envoy minus the owner's own "state change" log timestamp (ms resolution); split at
   the replica's "state change from the fleet" log line into Redis (owner -> adopted)
   and push (adopted -> Envoy). The owner's own Envoy is shown for comparison.
3. Takeover after SIGKILL: on the same fleet (Envoys stopped), ``--trials`` times kill
   (SIGKILL) a replica that owns some backends; from the kill to the first new probe at
   each orphaned backend (its ``/sim/stats`` polled every 20 ms). The killed replica is
   then started again and every replica must be sharing with 3 members before the next
   trial. Compared with the bound member_ttl + interval.

Every process is on loopback and stopped in a ``finally``; every wait is bounded.

    .venv/bin/python bench/fleet.py [--replicas 1 3 10] [--endpoints 100 1000] [--window 8]
        [--warmup 2] [--settle 5] [--start-limit 20] [--events 20] [--backends 6]
        [--trials 5] [--parts 1 2 3] [--run-overloaded]
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

import redis  # noqa: E402
from procs import cpu_seconds, load_average  # noqa: E402

from common import free_port_block, stats_row, write_result  # noqa: E402
from llm_health.fleet.ownership import endpoint_key, owner_of  # noqa: E402
from tests.envoy_harness import EnvoyProcess, render_config  # noqa: E402
from tests.polling import wait_until  # noqa: E402
from tests.ports import free_port  # noqa: E402
from tests.processes import PluginProcess, SimProcess, http_json  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

CLUSTER = "llama-70b"
FAST = ("--ttft", "20ms", "--tpot", "2ms")
INTERVAL_S, HEARTBEAT_S, MEMBER_TTL_S = 1.0, 1.0, 3.0
PORTS_PER_SIM = 500
OVERLOADED = 0.9  # probes achieved / scheduled below this: the row is marked overloaded
ENVOY_POLL_S = 0.005
SIM_POLL_S = 0.02
FLEET_REPLICAS = 3  # parts 2 and 3
#: Part 1 runs the replicas at this nice level: the simulated backends stand for GPU
#: servers elsewhere, so they (and this script's counters) are served first and the
#: replicas' own CPU limit shows, instead of backends starved by ten replicas.
REPLICA_NICE = 10
#: Fleet counters shown (summed over the replicas, since their start) when not zero.
CHURN = {
    "rejoins_total": "rejoins",
    "fallbacks_total": "fallbacks",
    "verdicts_fenced_total": "fenced publishes",
}
STATUS_TIMEOUT_S = 10.0  # /status of every replica around the window (asked in parallel)
#: Commands the replicas send themselves (the others run inside the Lua scripts).
CLIENT_COMMANDS = {
    "evalsha", "eval", "script", "hscan", "hmget", "hgetall", "subscribe", "unsubscribe",
    "psubscribe", "ping", "hello", "client", "select", "auth",
}  # fmt: skip


# --------------------------------------------------------------------------- helpers


def log_wall(stamp: str) -> float:
    """Wall seconds of a log record's ``ts`` ("2026-01-02T03:04:05.678Z")."""
    whole, millis = stamp.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000


def plugin_settings(
    addresses: list[str], fleet: dict[str, Any] | None, envoy: bool = False
) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "probe": {"model": "sim-model", "interval": f"{INTERVAL_S:g}s"},
        "clusters": [{"name": CLUSTER, "endpoints": [{"address": a} for a in addresses]}],
    }
    if envoy:
        settings["xds"] = {"warm_start_timeout": "5s"}
    if fleet is not None:
        settings["fleet"] = fleet
    return settings


def fleet_section(url: str, name: str, index: int) -> dict[str, Any]:
    return {
        "redis": url,
        "name": name,
        "member_id": f"gw-{index}",
        "heartbeat": f"{HEARTBEAT_S:g}s",
        "member_ttl": f"{MEMBER_TTL_S:g}s",
    }


def stop_all(processes: list[Any], grace_s: float = 5.0) -> None:
    """SIGTERM to every plugin/sim process at once, then reap each (SIGKILL after
    ``grace_s``); Envoys (no ``process`` attribute) through their own ``stop``."""
    popens: list[subprocess.Popen[bytes]] = []
    for item in processes:
        popen = getattr(item, "process", None)
        if isinstance(popen, subprocess.Popen):
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)
            popens.append(popen)
        else:
            try:
                item.stop()
            except Exception as exc:  # keep stopping the others
                print(f"stopping {item}: {exc!r}", file=sys.stderr)
    deadline = time.monotonic() + grace_s
    for popen in popens:
        try:
            popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def machine_busy_s() -> float:
    """CPU seconds the whole machine (every core, every process) has been busy."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4] + (fields[7] if len(fields) > 7 else 0)  # idle, iowait, steal
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def pid_of(process: Any) -> int | None:
    popen = getattr(process, "process", None)
    if isinstance(popen, subprocess.Popen) and popen.poll() is None:
        return popen.pid
    return None


def cpu_of(processes: list[Any]) -> float:
    total = 0.0
    for process in processes:
        pid = pid_of(process)
        if pid is not None:
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
    return total


# --------------------------------------------------------------------------- 1: load


class Backends:
    """``count`` simulated backends on consecutive ports, PORTS_PER_SIM per process."""

    def __init__(self, workdir: Path, count: int) -> None:
        self.count = count
        self.sims: list[SimProcess] = []
        base = free_port_block(count)
        self.addresses = [f"127.0.0.1:{base + i}" for i in range(count)]
        try:
            for first in range(0, count, PORTS_PER_SIM):
                ports = min(PORTS_PER_SIM, count - first)
                sim = SimProcess(
                    workdir,
                    f"n{count}-{first}",
                    *FAST,
                    "--port-count",
                    str(ports),
                    port=base + first,
                )
                self.sims.append(sim)
            for sim, first in zip(self.sims, range(0, count, PORTS_PER_SIM), strict=True):
                last = base + min(first + PORTS_PER_SIM, count) - 1
                sim.wait_up(30)
                wait_until(lambda p=last: listening(p), 60, f"sim port {last}")
        except BaseException:
            self.stop()
            raise

    def probes(self) -> int:
        """Probes counted by every simulator (long timeout: they may be overloaded)."""
        return sum(
            int(http_json(f"http://{sim.address}/sim/stats", timeout=15)["probe_requests"])
            for sim in self.sims
        )

    def stop(self) -> None:
        stop_all(self.sims)


def redis_info(client: redis.Redis) -> dict[str, Any]:
    info: dict[str, Any] = client.info("all")
    return info


def snapshot(
    backends: Backends, client: redis.Redis, redis_pid: int | None, plugins: list[PluginProcess]
) -> dict[str, Any]:
    started = time.monotonic()
    try:
        probes: int | None = backends.probes()
    except OSError:  # a simulator too overloaded to answer in 15 s
        probes = None
    info = redis_info(client)
    redis_cpu = cpu_seconds(redis_pid) if redis_pid is not None else 0.0
    replicas_cpu = cpu_of(plugins)
    sims_cpu = cpu_of(backends.sims)
    return {
        "at": (started + time.monotonic()) / 2,
        "took": time.monotonic() - started,
        "machine": machine_busy_s(),
        "probes": probes,
        "total": int(info["total_commands_processed"]),
        "calls": {
            k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in info.items()
            if k.startswith("cmdstat_")
        },
        "redis_cpu": redis_cpu,
        "replicas_cpu": replicas_cpu,
        "sims_cpu": sims_cpu,
    }


def statuses(plugins: list[PluginProcess], timeout_s: float = 15.0) -> list[dict[str, Any] | None]:
    """Every replica's ``/status``, asked in parallel (an overloaded replica answers late);
    None for one that did not answer within ``timeout_s``."""

    def one(plugin: PluginProcess) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = http_json(
                f"http://127.0.0.1:{plugin.http_port}/status", timeout=timeout_s
            )
        except (OSError, ValueError):
            return None
        return result

    with ThreadPoolExecutor(max(1, len(plugins))) as pool:
        return list(pool.map(one, plugins))


def fleet_counter(answers: list[dict[str, Any] | None], name: str) -> int | None:
    """The sum of a fleet counter over every replica (None: one did not answer)."""
    if any(a is None for a in answers):
        return None
    return sum(int(a["fleet"][name]) for a in answers if a is not None)


def all_sharing(plugins: list[PluginProcess], members: int, timeout_s: float = 15.0) -> bool:
    for answer in statuses(plugins, timeout_s):
        if answer is None:
            return False
        fleet = answer["fleet"]
        if fleet["mode"] != "sharing" or fleet["members"] != members:
            return False
    return True


def end_states(answers: list[dict[str, Any] | None], fleet: bool) -> dict[str, Any]:
    """Endpoints not healthy on each replica's board; fleet: owners per replica view."""
    not_healthy, owned, sharing, owner_views = 0, 0, 0, set()
    answered = 0
    totals = dict.fromkeys(CHURN, 0)
    for status in answers:
        if status is None:
            continue
        answered += 1
        not_healthy += sum(
            e["state"] != "healthy" for c in status["clusters"] for e in c["endpoints"]
        )
        if fleet:
            part = status["fleet"]
            sharing += part["mode"] == "sharing"
            owned += part["owned_endpoints"] or 0
            for name in CHURN:
                totals[name] += int(part.get(name, 0))
            owner_views.add(tuple(sorted((k, v["owner"]) for k, v in part["endpoints"].items())))
    return {
        "answered": answered,
        "not_healthy": not_healthy,
        "owned": owned,
        "sharing": sharing,
        "owners_agree": len(owner_views) == 1,
        "churn": totals,
    }


def settle(plugins: list[PluginProcess], endpoints: int, limit_s: float) -> float | None:
    """Seconds until every replica's board shows every endpoint healthy (the start-up
    storm of first probes over), polled every 0.5 s; None: not within ``limit_s``."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        answers = statuses(plugins, timeout_s=max(1.0, limit_s - (time.monotonic() - started)))
        if all(
            a is not None
            and sum(e["state"] == "healthy" for c in a["clusters"] for e in c["endpoints"])
            == endpoints
            for a in answers
        ):
            return time.monotonic() - started
        time.sleep(0.5)
    return None


def measure_window(
    server: RedisServer,
    client: redis.Redis,
    backends: Backends,
    plugins: list[PluginProcess],
    fleet: bool,
    endpoints: int,
    window_s: float,
) -> dict[str, Any]:
    redis_pid = server.process.pid if server.process is not None else None
    commands_before = (
        fleet_counter(statuses(plugins, STATUS_TIMEOUT_S), "redis_commands_total") if fleet else 0
    )
    before = snapshot(backends, client, redis_pid, plugins)
    time.sleep(window_s)
    after = snapshot(backends, client, redis_pid, plugins)
    answers = statuses(plugins, STATUS_TIMEOUT_S)
    commands_after = fleet_counter(answers, "redis_commands_total") if fleet else 0
    ends = end_states(answers, fleet)
    wall = after["at"] - before["at"]
    calls = {k: v - before["calls"].get(k, 0) for k, v in after["calls"].items()}
    calls = {k: v for k, v in calls.items() if v}
    own = calls.pop("info", 0)
    everything = after["total"] - before["total"] - own
    client_side = sum(v for k, v in calls.items() if k in CLIENT_COMMANDS)
    probes = (
        None
        if after["probes"] is None or before["probes"] is None
        else after["probes"] - before["probes"]
    )
    replicas = len(plugins)
    counted = (
        None
        if commands_before is None or commands_after is None
        else (commands_after - commands_before) / wall
    )
    return {
        "replicas": replicas,
        "endpoints": endpoints,
        "mode": "fleet" if fleet else "independent",
        "wall_s": wall,
        "scheduled": endpoints / INTERVAL_S * (1 if fleet else replicas),
        "probes_s": None if probes is None else probes / wall,
        "per_backend_s": None if probes is None else probes / wall / endpoints,
        "snapshot_s": max(before["took"], after["took"]),
        "machine_cpu": 100 * (after["machine"] - before["machine"]) / wall,
        "client_s": client_side / wall,
        "all_s": everything / wall,
        "calls_s": {k: v / wall for k, v in sorted(calls.items())},
        "counted_s": counted,
        "replicas_cpu": 100 * (after["replicas_cpu"] - before["replicas_cpu"]) / wall,
        "sims_cpu": 100 * (after["sims_cpu"] - before["sims_cpu"]) / wall,
        "redis_cpu": 100 * (after["redis_cpu"] - before["redis_cpu"]) / wall,
        **ends,
    }


def start_replicas(
    workdir: Path, server: RedisServer, addresses: list[str], replicas: int, fleet: bool
) -> list[PluginProcess]:
    tag = f"{'fleet' if fleet else 'indep'}-r{replicas}-n{len(addresses)}"
    plugins: list[PluginProcess] = []
    try:
        for index in range(replicas):
            section = fleet_section(server.url, tag, index) if fleet else None
            plugin = PluginProcess(workdir / tag / f"r{index}", plugin_settings(addresses, section))
            plugins.append(plugin)
            plugin.start()
            assert plugin.process is not None
            os.setpriority(os.PRIO_PROCESS, plugin.process.pid, REPLICA_NICE)
    except BaseException:
        stop_all(plugins)
        raise
    return plugins


def wait_started(plugins: list[PluginProcess], fleet: bool, limit_s: float) -> float | None:
    """Seconds until every replica answers ``/readyz`` (fleet: and shares with all the
    others); None if not within ``limit_s`` (the row is measured all the same)."""
    started = time.monotonic()

    def ready() -> bool:
        left = max(0.5, min(5.0, limit_s - (time.monotonic() - started)))
        for plugin in plugins:
            if plugin.process is not None and plugin.process.poll() is not None:
                raise RuntimeError(f"a replica exited: {plugin.log_tail()}")
            http_json(f"http://127.0.0.1:{plugin.http_port}/readyz", timeout=left)
        return not fleet or all_sharing(plugins, len(plugins), left)

    while time.monotonic() - started < limit_s:
        try:
            if ready():
                return time.monotonic() - started
        except OSError:  # not listening yet, 503 (HTTPError), or too slow to answer
            pass
        time.sleep(0.25)
    return None


def measure_row(
    workdir: Path,
    server: RedisServer,
    client: redis.Redis,
    backends: Backends,
    replicas: int,
    endpoints: int,
    fleet: bool,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Fresh replicas on ``endpoints`` backends: start, settle, warm up, one window."""
    plugins = start_replicas(workdir, server, backends.addresses[:endpoints], replicas, fleet)
    try:
        ready_s = wait_started(plugins, fleet, args.start_limit)
        settled_s = settle(plugins, endpoints, args.settle)
        time.sleep(args.warmup)
        row = measure_window(server, client, backends, plugins, fleet, endpoints, args.window)
    finally:
        stop_all(plugins)
    row.update(ready_s=ready_s, settled_s=settled_s)
    print(
        f"  {row['mode']:11s} r={replicas:2d} n={endpoints:4d}: "
        f"{row['probes_s'] or 0:7.1f} probes/s ({row['per_backend_s'] or 0:.2f}/backend), "
        f"Redis {row['client_s']:.1f} client / {row['all_s']:.1f} all cmds/s, "
        f"replicas CPU {row['replicas_cpu']:.0f} %, machine {row['machine_cpu']:.0f} %, "
        f"ready {'-' if ready_s is None else f'{ready_s:.1f} s'}, all healthy after "
        f"{'-' if settled_s is None else f'{settled_s:.1f} s'}",
        flush=True,
    )
    return row


def is_overloaded(row: dict[str, Any]) -> bool:
    return row["probes_s"] is None or row["probes_s"] < OVERLOADED * row["scheduled"]


def skipped(replicas: int, endpoints: int, overloaded_at: int) -> dict[str, Any]:
    """An independent row not run: fewer independent replicas already overloaded."""
    return {
        "replicas": replicas,
        "endpoints": endpoints,
        "mode": "independent",
        "scheduled": endpoints / INTERVAL_S * replicas,
        "skipped": overloaded_at,
    }


def part_load(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    server = RedisServer(workdir / "redis-load").start()
    client = redis.Redis.from_url(server.url, socket_timeout=10)
    try:
        backends = Backends(workdir / "sims", max(args.endpoints))
        try:
            for endpoints in sorted(args.endpoints):
                overloaded_at: int | None = None  # fewest independent replicas overloaded
                for replicas in sorted(args.replicas):
                    for fleet in (True, False):
                        if not fleet and overloaded_at is not None and not args.run_overloaded:
                            rows.append(skipped(replicas, endpoints, overloaded_at))
                            print(f"  independent r={replicas:2d} n={endpoints:4d}: not run")
                            continue
                        row = measure_row(
                            workdir, server, client, backends, replicas, endpoints, fleet, args
                        )
                        rows.append(row)
                        if not fleet and is_overloaded(row) and overloaded_at is None:
                            overloaded_at = replicas
        finally:
            backends.stop()
    finally:
        client.close()
        server.stop()
    return rows


def load_summary(rows: list[dict[str, Any]]) -> list[str]:
    """Fleet against independent, per size, from the rows (nothing but their figures)."""
    measured = {(r["replicas"], r["endpoints"], r["mode"]): r for r in rows if "skipped" not in r}
    out = ["Side by side (per backend: probes it received per second):", ""]
    for (replicas, endpoints, mode), fleet in measured.items():
        alone = measured.get((replicas, endpoints, "independent"))
        if mode != "fleet" or alone is None:
            continue
        if fleet["per_backend_s"] is None or alone["per_backend_s"] is None:
            continue
        flags = [name for name, r in (("fleet", fleet), ("independent", alone)) if is_overloaded(r)]
        ratio = alone["per_backend_s"] / fleet["per_backend_s"] if fleet["per_backend_s"] else 0
        out.append(
            f"- {replicas} x {endpoints}: {fleet['per_backend_s']:.2f} probes per backend per "
            f"second with `fleet:`, {alone['per_backend_s']:.2f} without ({ratio:.1f} x); "
            f"Redis {fleet['client_s']:.1f} commands/s sent ({fleet['client_s'] / replicas:.1f}"
            f" per replica), {fleet['all_s']:.0f}/s counting those inside the scripts; "
            f"replicas' CPU {fleet['replicas_cpu']:.0f} % against {alone['replicas_cpu']:.0f} %"
            + (f" (**overloaded**: {' and '.join(flags)})" if flags else "")
        )
    return out


def load_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "## 1. Probes per backend and Redis commands",
        "",
        f"Interval {INTERVAL_S:g} s, timeout 800 ms, heartbeat {HEARTBEAT_S:g} s, member_ttl "
        f"{MEMBER_TTL_S:g} s; simulators TTFT 20 ms, TPOT 2 ms, up to {PORTS_PER_SIM} ports "
        f"per process. Replicas run at nice {REPLICA_NICE} (the simulators stand for GPU "
        "servers elsewhere: served first). Every row starts fresh replicas ('independent' = "
        "the same replicas "
        "without `fleet:`), waits until every one is ready (fleet: sharing, with all "
        f"members; at most {args.start_limit:g} s), then until every replica's board shows "
        f"every endpoint healthy (at most {args.settle:g} s: 'never' = not within that), "
        f"then {args.warmup:g} s, then measures a {args.window:g} s window. Redis 'client' = "
        "commands the replicas send (EVALSHA, HSCAN, HMGET, SUBSCRIBE...; a Lua script "
        "counts one), 'all' = Redis's `total_commands_processed`, which also counts every "
        "command run inside the scripts (this script's INFO calls subtracted); 'replicas' "
        "own count' = the sum of their `redis_commands_total` (counted when a command is "
        "queued, so bursts such as a republish of every owned verdict fall on either side of "
        "the window differently). CPU in % of one core over "
        "the window (the machine has "
        f"{os.cpu_count()} cores: {100 * (os.cpu_count() or 1)} % is all of it); 'machine' = "
        "every process on the machine, this benchmark's and anything else running. 'not "
        "healthy at end' = endpoints not HEALTHY, summed over every replica's board, right "
        "after the window (the simulators are healthy throughout: any is a false verdict). "
        "'since start' counters (fleet): 'rejoins' = a replica found itself evicted (its "
        "heartbeat later than member_ttl) and joined again with a new epoch, which "
        "republishes every verdict it owns; 'fenced publishes' = verdicts Redis refused "
        "(not a live member with that epoch, or not the owner); 'fallbacks' = Redis "
        "unreachable for member_ttl. A row below "
        f"{100 * OVERLOADED:.0f} % of its schedule is marked **overloaded**; an independent "
        "row is not run (and says so) once fewer independent replicas of the same size "
        "were already overloaded.",
        "",
        "| replicas | endpoints | mode | probes/s scheduled | probes/s achieved "
        "| probes / backend / s | Redis client cmds/s | Redis all cmds/s "
        "| replicas' own count cmds/s | replicas CPU | sims CPU | Redis CPU | machine CPU "
        "| ready s / all healthy s | not healthy at end | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(
                f"| {r['replicas']} | {r['endpoints']} | {r['mode']} | {r['scheduled']:.0f} "
                "| not run | | | | | | | | | | | **overloaded** before it: "
                f"{r['skipped']} independent replica(s) already below "
                f"{100 * OVERLOADED:.0f} % of the schedule (`--run-overloaded` runs it) |"
            )
            continue
        notes = []
        if r["probes_s"] is None:
            notes.append("**overloaded**: the simulators did not answer /sim/stats in 15 s")
        elif r["probes_s"] / r["scheduled"] < OVERLOADED:
            share = r["probes_s"] / r["scheduled"]
            notes.append(f"**overloaded**: {100 * share:.0f} % of the schedule")
        if r["mode"] == "fleet":
            notes.append(
                f"{r['sharing']}/{r['replicas']} sharing, owned {r['owned']}/{r['endpoints']}"
                f", owners {'agree' if r['owners_agree'] else 'DISAGREE'}"
            )
        churn = [f"{CHURN[k]} {v}" for k, v in r.get("churn", {}).items() if v]
        if churn:
            notes.append("since start: " + ", ".join(churn))
        if r["answered"] < r["replicas"]:
            notes.append(f"{r['replicas'] - r['answered']} replica(s) did not answer /status")
        if r["snapshot_s"] > 1:
            notes.append(f"reading the counters took up to {r['snapshot_s']:.1f} s")
        probes = "—" if r["probes_s"] is None else f"{r['probes_s']:.0f}"
        per_backend = "—" if r["per_backend_s"] is None else f"{r['per_backend_s']:.2f}"
        ready = "never" if r["ready_s"] is None else f"{r['ready_s']:.1f}"
        settled = "never" if r["settled_s"] is None else f"{r['settled_s']:.1f}"
        counted = "—" if r["mode"] != "fleet" or r["counted_s"] is None else f"{r['counted_s']:.1f}"
        lines.append(
            f"| {r['replicas']} | {r['endpoints']} | {r['mode']} | {r['scheduled']:.0f} "
            f"| {probes} | {per_backend} | {r['client_s']:.1f} | {r['all_s']:.1f} | {counted} "
            f"| {r['replicas_cpu']:.0f} % | {r['sims_cpu']:.0f} % | {r['redis_cpu']:.1f} % "
            f"| {r['machine_cpu']:.0f} % | {ready} / {settled} | {r['not_healthy']} "
            f"| {'; '.join(notes)} |"
        )
    lines += ["", *load_summary(rows)]
    lines += [
        "",
        "Redis commands per second by command (fleet rows; script-internal ones included):",
        "",
    ]
    for r in rows:
        if r["mode"] != "fleet" or "skipped" in r:
            continue
        parts = ", ".join(f"{k} {v:.1f}" for k, v in r["calls_s"].items())
        lines.append(f"- {r['replicas']} x {r['endpoints']}: {parts or 'none'}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- 2, 3: fleet


class Fleet:
    """Redis, ``backends`` simulators (one process each: faults are per process) and
    replicas gw-0..gw-2, each optionally with its own Envoy."""

    def __init__(self, workdir: Path, backends: int) -> None:
        self.workdir = workdir
        self.sims: list[SimProcess] = []
        self.plugins: dict[int, PluginProcess] = {}
        self.envoys: dict[int, EnvoyProcess] = {}
        self.retired: list[Any] = []
        self._starts = 0
        self.redis = RedisServer(workdir / "redis-fleet").start()
        self.sims = [SimProcess(workdir, f"b{i}", *FAST) for i in range(backends)]
        for sim in self.sims:
            sim.wait_up()

    def start(self, index: int, envoy: bool) -> PluginProcess:
        self._starts += 1
        section = fleet_section(self.redis.url, "bench-gateway", index)
        settings = plugin_settings([s.address for s in self.sims], section, envoy=envoy)
        plugin = PluginProcess(self.workdir / f"gw-{index}-{self._starts}", settings)
        self.plugins[index] = plugin
        plugin.start().wait_ready(30)
        if envoy:
            rendered = render_config(
                ROOT / "envoy-configs" / "sidecar-ads.yaml",
                self.workdir / f"envoy-{index}.yaml",
                xds_port=plugin.grpc_port,
                listener_port=free_port(),
                admin_port=0,
            )
            process = EnvoyProcess(
                rendered, workdir=self.workdir / f"envoy-{index}", ready_timeout=60
            )
            self.envoys[index] = process
            process.start()
        return plugin

    def wait_sharing(self, timeout_s: float = 20.0) -> None:
        plugins = list(self.plugins.values())
        wait_until(lambda: all_sharing(plugins, len(plugins)), timeout_s, "every replica sharing")

    def members(self) -> list[str]:
        return list(next(iter(self.plugins.values())).status()["fleet"]["member_ids"])

    def owner(self, sim: SimProcess, members: list[str]) -> int:
        member = owner_of(endpoint_key(CLUSTER, sim.address), members)
        assert member is not None
        return int(member.removeprefix("gw-"))

    def processes(self) -> list[Any]:
        return [*self.envoys.values(), *self.plugins.values(), *self.retired, *self.sims]

    def stop(self) -> None:
        try:
            stop_all(self.processes())
        finally:
            self.redis.stop()


def envoy_times(
    pool: ThreadPoolExecutor,
    envoys: dict[int, EnvoyProcess],
    test: Callable[[tuple[str, int] | None], bool],
    address: str,
    limit_s: float,
) -> dict[int, tuple[float, int] | None]:
    """Per Envoy, polled every ENVOY_POLL_S in its own thread: (wall time of the first
    answer where ``test(host)`` holds, polls), None if not within ``limit_s``."""

    def one(envoy: EnvoyProcess) -> tuple[float, int] | None:
        deadline = time.monotonic() + limit_s
        polls = 0
        while time.monotonic() < deadline:
            polls += 1
            try:
                host = envoy.view(CLUSTER).get(address)
            except (OSError, ValueError, KeyError):
                host = None
            if test(host):
                return time.time(), polls
            time.sleep(ENVOY_POLL_S)
        return None

    futures = {index: pool.submit(one, envoy) for index, envoy in envoys.items()}
    return {index: future.result() for index, future in futures.items()}


def unhealthy(host: tuple[str, int] | None) -> bool:
    return host is not None and host[0] == "UNHEALTHY"


def healthy(host: tuple[str, int] | None) -> bool:
    return host is not None and host[0] == "HEALTHY"


def first_record(
    plugin: PluginProcess, msg: str, address: str, after: float, before: float
) -> float | None:
    """Wall time of ``plugin``'s first log line ``msg`` (to unhealthy) for ``address``
    within [after, before] (the log's ms truncation allowed for)."""
    for record in plugin.log_records():
        if (
            record.get("msg") == msg
            and record.get("endpoint") == address
            and record.get("to") == "unhealthy"
            and "ts" in record
        ):
            wall = log_wall(record["ts"])
            if after - 0.002 <= wall <= before + 0.002:
                return wall
    return None


def part_propagation(fleet: Fleet, events: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    members = fleet.members()
    with ThreadPoolExecutor(len(fleet.envoys)) as pool:
        for event in range(events):
            sim = fleet.sims[event % len(fleet.sims)]
            back = envoy_times(pool, fleet.envoys, healthy, sim.address, 20)
            if any(v is None for v in back.values()):
                raise RuntimeError(f"{sim.address} not HEALTHY again in every Envoy in 20 s")
            time.sleep(rng.uniform(0.0, INTERVAL_S))
            owner = fleet.owner(sim, members)
            injected = time.time()
            sim.set_fault(fault="cuda_error")
            try:
                seen = envoy_times(pool, fleet.envoys, unhealthy, sim.address, INTERVAL_S + 10)
            finally:
                sim.set_fault(fault="none")
            rows.append(
                {"address": sim.address, "owner": owner, "injected": injected, "seen": seen}
            )
            shown = ", ".join(
                f"gw-{i} {'-' if v is None else f'{(v[0] - injected) * 1000:.0f} ms'}"
                for i, v in sorted(seen.items())
            )
            print(f"  event {event + 1:2d} {sim.address} owner gw-{owner}: {shown}", flush=True)
    for row in rows:  # the plugins' logs, once every event is done
        last = max((v[0] for v in row["seen"].values() if v is not None), default=time.time())
        owner = fleet.plugins[row["owner"]]
        row["verdict"] = first_record(owner, "state change", row["address"], row["injected"], last)
        row["adopted"] = {
            index: first_record(
                plugin, "state change from the fleet", row["address"], row["injected"], last
            )
            for index, plugin in fleet.plugins.items()
            if index != row["owner"]
        }
    return rows


def propagation_text(rows: list[dict[str, Any]], backends: int) -> str:
    total, redis_part, push_part, own, detect, polls = [], [], [], [], [], []
    missing = 0
    for row in rows:
        verdict = row["verdict"]
        if verdict is None:
            missing += 1
            continue
        detect.append((verdict - row["injected"]) * 1000)
        for index, got in row["seen"].items():
            if got is None:
                missing += 1
                continue
            polls.append(got[1])
            lag = (got[0] - verdict) * 1000
            if index == row["owner"]:
                own.append(lag)
                continue
            total.append(lag)
            adopted = row["adopted"].get(index)
            if adopted is not None:
                redis_part.append((adopted - verdict) * 1000)
                push_part.append((got[0] - adopted) * 1000)

    lines = [
        "## 2. Verdict propagation: owner's verdict -> another replica's Envoy",
        "",
        f"{FLEET_REPLICAS} replicas, each with its own Envoy (`sidecar-ads.yaml`, ADS SotW), "
        f"{backends} backends, {len(rows)} `cuda_error` faults on the backends in turn, each "
        "after a random 0..1 s wait, cleared once every Envoy showed UNHEALTHY. From the "
        "owner's own 'state change' log line (ms resolution) to the first admin answer "
        f"showing UNHEALTHY, each Envoy polled every {ENVOY_POLL_S * 1000:.0f} ms in its own "
        f"thread ({statistics.mean(polls) if polls else 0:.0f} polls per Envoy and event on "
        "average; one poll, an admin `/clusters` call, takes a few ms).",
        "",
        "| path | n | p50 ms | p99 ms | max ms | mean ms |",
        "|---|---|---|---|---|---|",
        stats_row("owner's verdict -> other replica's Envoy", total),
        stats_row("  Redis part (verdict -> other replica adopted it, its log)", redis_part),
        stats_row("  push part (adopted -> its Envoy shows it)", push_part),
        stats_row("owner's verdict -> owner's own Envoy (no Redis)", own),
        stats_row("fault injected -> owner's verdict (detection)", detect),
    ]
    if missing:
        lines += ["", f"Unmatched (no log line or no Envoy answer in time): {missing}."]
    return "\n".join(lines)


def part_takeover(fleet: Fleet, trials: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for trial in range(trials):
        members = fleet.members()
        owners = {fleet.owner(s, members) for s in fleet.sims}
        candidates = [i for i in range(FLEET_REPLICAS) if i in owners]
        victim = candidates[trial % len(candidates)]
        orphans = [s for s in fleet.sims if fleet.owner(s, members) == victim]
        plugin = fleet.plugins.pop(victim)
        assert plugin.process is not None
        # A join makes every replica beat at once: without this the kill would always
        # fall at the same phase of the (aligned) heartbeats.
        time.sleep(rng.uniform(0.0, HEARTBEAT_S))
        killed = time.monotonic()
        plugin.process.kill()
        plugin.process.wait()
        fleet.retired.append(plugin)
        counts = {s.address: int(s.stats()["probe_requests"]) for s in orphans}
        probed: dict[str, float] = {}
        deadline = killed + MEMBER_TTL_S + INTERVAL_S + 15
        while len(probed) < len(orphans) and time.monotonic() < deadline:
            for sim in orphans:
                if (
                    sim.address not in probed
                    and int(sim.stats()["probe_requests"]) > counts[sim.address]
                ):
                    probed[sim.address] = time.monotonic() - killed
            time.sleep(SIM_POLL_S)
        times = [probed.get(s.address) for s in orphans]
        rows.append({"victim": victim, "orphans": len(orphans), "times": times})
        shown = ", ".join("-" if t is None else f"{t:.2f} s" for t in times)
        print(f"  trial {trial + 1}: killed gw-{victim}, {len(orphans)} orphan(s): {shown}")
        fleet.start(victim, envoy=False)
        fleet.wait_sharing(MEMBER_TTL_S + 20)
        time.sleep(2 * HEARTBEAT_S)  # the returning replica's endpoints settle back
    return rows


def takeover_text(rows: list[dict[str, Any]]) -> str:
    times = [t for row in rows for t in row["times"] if t is not None]
    missed = sum(t is None for row in rows for t in row["times"])
    bound = MEMBER_TTL_S + INTERVAL_S
    per_trial = "; ".join(
        f"gw-{r['victim']}: " + ", ".join("—" if t is None else f"{t:.2f}" for t in r["times"])
        for r in rows
    )
    lines = [
        "## 3. Takeover after SIGKILL",
        "",
        f"{FLEET_REPLICAS} replicas (no Envoy), member_ttl {MEMBER_TTL_S:g} s, heartbeat "
        f"{HEARTBEAT_S:g} s, interval {INTERVAL_S:g} s. {len(rows)} trials: SIGKILL of a "
        "replica owning backends (after a random 0..heartbeat wait: a join aligns every "
        "replica's heartbeats, so the kill falls at a random phase of them), then each "
        "orphaned backend's probe counter polled every "
        f"{SIM_POLL_S * 1000:.0f} ms until a new probe arrives; the killed replica is then "
        "restarted and every replica must share again before the next trial.",
        "",
        "| orphaned backends | p50 s | max s | min s | bound member_ttl + interval s "
        "| over the bound |",
        "|---|---|---|---|---|---|",
    ]
    if times:
        over = sum(t > bound for t in times)
        lines.append(
            f"| {len(times)} | {statistics.median(times):.2f} | {max(times):.2f} "
            f"| {min(times):.2f} | {bound:g} | {over} |"
        )
    else:
        lines.append(f"| 0 | — | — | — | {bound:g} | — |")
    lines += ["", f"Per trial (s from the kill): {per_trial}."]
    if missed:
        lines.append(f"Not probed again within the wait: {missed}.")
    return "\n".join(lines)


@contextlib.contextmanager
def fleet_of(workdir: Path, backends: int) -> Iterator[Fleet]:
    fleet = Fleet(workdir, backends)
    try:
        yield fleet
    finally:
        fleet.stop()


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 3, 10])
    parser.add_argument("--endpoints", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--window", type=float, default=8.0, help="seconds measured per row")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before the window")
    parser.add_argument(
        "--settle", type=float, default=5.0, help="at most this long for all healthy, s"
    )
    parser.add_argument(
        "--start-limit", type=float, default=20.0, help="at most this long for ready, s"
    )
    parser.add_argument(
        "--run-overloaded",
        action="store_true",
        help="run independent rows even when fewer replicas were already overloaded",
    )
    parser.add_argument("--events", type=int, default=20, help="faults (part 2)")
    parser.add_argument("--backends", type=int, default=6, help="backends (parts 2, 3)")
    parser.add_argument("--trials", type=int, default=5, help="SIGKILLs (part 3)")
    parser.add_argument("--parts", type=int, nargs="+", choices=(1, 2, 3), default=[1, 2, 3])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    started = time.monotonic()
    load_before = load_average()
    workdir = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    sections: list[str] = []
    try:
        if 1 in args.parts:
            print("part 1: load", flush=True)
            sections.append(load_table(part_load(args, workdir), args))
        if 2 in args.parts or 3 in args.parts:
            with fleet_of(workdir, args.backends) as fleet:
                envoy = 2 in args.parts
                for index in range(FLEET_REPLICAS):
                    fleet.start(index, envoy=envoy)
                fleet.wait_sharing()
                if envoy:
                    print("part 2: verdict propagation", flush=True)
                    rows = part_propagation(fleet, args.events, args.seed)
                    sections.append(propagation_text(rows, args.backends))
                    stop_all(list(fleet.envoys.values()))
                    fleet.envoys.clear()
                if 3 in args.parts:
                    print("part 3: takeover after SIGKILL", flush=True)
                    sections.append(takeover_text(part_takeover(fleet, args.trials, args.seed)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    command = (
        f"python bench/fleet.py --replicas {' '.join(map(str, args.replicas))} "
        f"--endpoints {' '.join(map(str, args.endpoints))} --window {args.window:g} "
        f"--warmup {args.warmup:g} --settle {args.settle:g} "
        f"--start-limit {args.start_limit:g} --events {args.events} --backends {args.backends} "
        f"--trials {args.trials}"
    )
    if args.run_overloaded:
        command += " --run-overloaded"
    if sorted(args.parts) != [1, 2, 3]:
        command += f" --parts {' '.join(map(str, args.parts))}"
    head = (
        f"Load average at the start: {load_before}; at the end: {load_average()}. "
        f"Whole run: {time.monotonic() - started:.0f} s."
    )
    text = "\n\n".join([head, *sections])
    print(text)
    write_result("fleet", text, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
