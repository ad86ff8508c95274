"""Footprint of `llm-health agent` (a real subprocess) probing one simulator at interval 1 s.

The agent runs with every default (`--engine` only: interval 1 s, known-answer probe every
30 s, the engine's /metrics every 1 s, the model found in /v1/models) against
`llm-health sim` (TTFT 50 ms). After a warm-up, for ``--duration`` seconds:

- the agent's CPU as a share of one core (``/proc/PID/stat`` utime + stime over the
  wall time), and its RSS (``VmRSS``, sampled; the peak ``VmHWM``), while nobody asks
  it anything (the kubelet's three probes every 10 s cost next to nothing);
- then for ``--ask`` seconds, the time each answer takes (``/startupz``, ``/readyz``,
  ``/livez``, ``/healthz``, ``/metrics``, ``/status``; a new connection each, as the
  kubelet's), p50 and max, every path every ``--ask-every`` seconds, and the CPU then.

Then the modules the agent's process imports are listed (``python -X importtime`` of
the import path of `llm-health agent`): grpc, protobuf and the Envoy protos must not be
among them.

    .venv/bin/python bench/agent_footprint.py --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import Sim, child_env, cpu_seconds, load_average, rss_mb  # noqa: E402

from common import free_port_block, machine_line  # noqa: E402
from tests.processes import AgentProcess  # noqa: E402

PATHS = ("/startupz", "/readyz", "/livez", "/healthz", "/metrics", "/status")
RESULT = ROOT / "bench" / "results" / "agent_footprint.txt"
HEAVY = ("grpc", "google.protobuf", "envoy", "xds", "udpa", "redis", "dns")
_OURS = ("llm_health",)
# What `llm-health agent` imports: the CLI, then app.agent (cli.agent imports it in run).
IMPORT_PATH = "import llm_health.cli; import llm_health.app.agent"


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def ask(port: int, path: str) -> tuple[float, int]:
    """(milliseconds, status) of one GET on a new connection."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return (time.perf_counter() - started) * 1000, response.status
    finally:
        connection.close()


async def measure(
    warmup_s: float, duration_s: float, ask_s: float, ask_every_s: float
) -> dict[str, Any]:
    port = free_port_block(1)
    sim = Sim(port, 1, ("--ttft", "50ms", "--tpot", "1ms"))
    workdir = Path(tempfile.mkdtemp(prefix="agent-footprint-"))
    agent = AgentProcess(workdir, f"http://127.0.0.1:{port}")
    try:
        sim.spawn()
        await sim.up(60)
        agent.start()
        await asyncio.to_thread(agent.wait_up, 60)
        assert agent.process is not None
        pid = agent.process.pid
        deadline = time.monotonic() + 30
        while agent.get("/readyz")[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the agent never became ready")
            await asyncio.sleep(0.2)
        await asyncio.sleep(warmup_s)
        probes0 = agent.status()["prober"]["probes_total"]
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        rss: list[float] = []
        while time.monotonic() - t0 < duration_s:  # nobody asks: the agent's own cost
            rss.append(rss_mb(pid))
            await asyncio.sleep(0.5)
        elapsed = time.monotonic() - t0
        cpu = cpu_seconds(pid) - cpu0
        probes = agent.status()["prober"]["probes_total"] - probes0
        answers: dict[str, list[float]] = {path: [] for path in PATHS}
        statuses: dict[str, set[int]] = {path: set() for path in PATHS}
        cpu1, t1 = cpu_seconds(pid), time.monotonic()
        while time.monotonic() - t1 < ask_s:  # then every path, every ask_every_s
            for path in PATHS:
                took, status = await asyncio.to_thread(ask, agent.http_port, path)
                answers[path].append(took)
                statuses[path].add(status)
            await asyncio.sleep(ask_every_s)
        asked = time.monotonic() - t1
        return {
            "cpu_pct": 100 * cpu / elapsed,
            "rss_mb": statistics.median(rss),
            "peak_rss_mb": peak_rss_mb(pid),
            "elapsed_s": elapsed,
            "probes_per_s": probes / elapsed,
            "answers": answers,
            "statuses": statuses,
            "asked_s": asked,
            "asked_cpu_pct": 100 * (cpu_seconds(pid) - cpu1) / asked,
        }
    finally:
        agent.stop()
        sim.stop()


def imported_modules() -> tuple[int, list[str], str]:
    """(module count, heavy top-level packages among them, the 8 costliest imports) of
    the agent's import path, from ``python -X importtime``."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", IMPORT_PATH],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        check=True,
    )
    rows = []  # (cumulative microseconds, name indented by nesting)
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self_us, cumulative, name = line.removeprefix("import time:").split("|")
        rows.append((int(cumulative), name.rstrip()[1:]))
    names = [name.strip() for _, name in rows]
    heavy = sorted({n.split(".")[0] for n in names if n.startswith(HEAVY)})
    packages = [(us, n.strip()) for us, n in rows if "." not in n and n.strip() not in _OURS]
    top = sorted(packages, reverse=True)[:8]
    costliest = ", ".join(f"{name} {us / 1000:.0f} ms" for us, name in top)
    return len(names), heavy, costliest


def report(result: dict[str, Any], duration_s: float, ask_every_s: float, load: str) -> str:
    lines = [
        "`llm-health agent` footprint: one engine (llm-health sim, TTFT 50 ms), every default "
        f"(interval 1 s), {duration_s:g} s measured after warm-up with nobody asking, then "
        f"every path asked every {ask_every_s:g} s for {result['asked_s']:.0f} s, a new "
        "connection each.",
        f"Machine: {machine_line()}; load average before: {load}, after: {load_average()}.",
        "",
        f"CPU: {result['cpu_pct']:.2f} % of one core (utime + stime over "
        f"{result['elapsed_s']:.0f} s), {result['probes_per_s']:.2f} probes/s",
        f"RSS: {result['rss_mb']:.1f} MiB (median VmRSS), peak {result['peak_rss_mb']:.1f} MiB "
        "(VmHWM)",
        f"CPU while every path is asked every {ask_every_s:g} s: "
        f"{result['asked_cpu_pct']:.2f} % of one core",
        "",
        "| path | answers | status | p50 | max |",
        "|---|---|---|---|---|",
    ]
    for path, took in result["answers"].items():
        status = "/".join(str(s) for s in sorted(result["statuses"][path]))
        lines.append(
            f"| `{path}` | {len(took)} | {status} | {statistics.median(took):.2f} ms "
            f"| {max(took):.2f} ms |"
        )
    count, heavy, costliest = imported_modules()
    lines += [
        "",
        f"Imports (`python -X importtime -c '{IMPORT_PATH}'`): {count} modules; "
        f"grpc/protobuf/Envoy/Redis/DNS among them: {', '.join(heavy) or 'none'}.",
        f"Costliest packages (cumulative import time, loaded machine): {costliest}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--ask", type=float, default=20.0)
    parser.add_argument("--ask-every", type=float, default=0.5)
    args = parser.parse_args()
    load = load_average()
    result = asyncio.run(measure(args.warmup, args.duration, args.ask, args.ask_every))
    text = report(result, args.duration, args.ask_every, load)
    command = "python bench/agent_footprint.py " + " ".join(sys.argv[1:])
    RESULT.parent.mkdir(exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    RESULT.write_text(f"{text}\nCommand: `{command.strip()}`\nRun: {stamp}\n")
    print(text)
    print(RESULT)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
