"""TTFT measurement error of the prober against the simulator's configured TTFT.

Starts one simulator process serving N ports (TTFT fixed, no jitter), probes every port at
`interval: 1s` with the real Scheduler + MicroProbe in this process for DURATION seconds,
and reports measured-minus-configured TTFT (p50/p99/max) and the prober's CPU use.
The simulator runs in its own process so its CPU is not counted as the prober's.

    .venv/bin/python bench/probe_accuracy.py --endpoints 1 200 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path

from llm_health.config import ProbeSettings
from llm_health.model.outcome import ProbeResult
from llm_health.probe.client import MicroProbe, new_connections
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.scheduler import Scheduler
from llm_health.probe.target import ProbeTarget

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port_block, wait_port, write_result

TTFT_MS = 100.0


async def measure(count: int, duration_s: float) -> dict[str, float]:
    base = free_port_block(count)
    sim = await asyncio.create_subprocess_exec(
        *[
            sys.executable,
            "-m",
            "llm_health.cli",
            "sim",
            "--port",
            str(base),
            "--port-count",
            str(count),
            "--ttft",
            f"{TTFT_MS:g}ms",
            "--tpot",
            "5ms",
        ],
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await wait_port(base + count - 1, 20)
        return await _probe_for(base, count, duration_s)
    finally:
        sim.terminate()
        await sim.wait()


async def _probe_for(base: int, count: int, duration_s: float) -> dict[str, float]:
    settings = ProbeSettings.model_validate(
        {"interval": "1s", "timeout": "800ms", "model": "sim-model"}
    )
    targets = [settings.to_target("bench", f"127.0.0.1:{base + i}") for i in range(count)]
    errors: list[float] = []
    lags: list[float] = []
    lag = LoopLagMonitor()

    def on_result(_target: ProbeTarget, result: ProbeResult) -> None:
        if result.ttft_ms is not None:
            errors.append(result.ttft_ms - TTFT_MS)
            lags.append(result.loop_lag_ms)

    async with new_connections() as connections:
        scheduler = Scheduler(targets, MicroProbe(connections, lag).start_probe, on_result)
        lag_task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.2)
        cpu0, wall0 = _cpu_s(), time.perf_counter()
        task = asyncio.create_task(scheduler.run())
        await asyncio.sleep(duration_s)
        cpu, wall = _cpu_s() - cpu0, time.perf_counter() - wall0
        task.cancel()
        lag_task.cancel()
        await asyncio.gather(task, lag_task, return_exceptions=True)
    errors.sort()
    return {
        "endpoints": count,
        "probes": len(errors),
        "probes_per_s": len(errors) / wall,
        "err_p50_ms": statistics.median(errors),
        "err_p99_ms": errors[int(len(errors) * 0.99) - 1] if len(errors) > 1 else errors[0],
        "err_max_ms": errors[-1],
        "loop_lag_p99_ms": sorted(lags)[int(len(lags) * 0.99) - 1] if len(lags) > 1 else lags[0],
        "cpu_percent": 100 * cpu / wall,
    }


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoints", type=int, nargs="+", default=[1, 200])
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    rows = [asyncio.run(measure(n, args.duration)) for n in args.endpoints]
    header = (
        "| endpoints | probes | probes/s | TTFT error p50 | p99 | max | loop lag p99 | prober CPU |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r['endpoints']:.0f}", f"{r['probes']:.0f}", f"{r['probes_per_s']:.1f}"]
        cells += [f"{r[k]:.2f} ms" for k in ("err_p50_ms", "err_p99_ms", "err_max_ms")]
        cells += [f"{r['loop_lag_p99_ms']:.2f} ms", f"{r['cpu_percent']:.1f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    command = "python bench/probe_accuracy.py " + " ".join(sys.argv[1:])
    write_result(
        "probe_accuracy", f"Simulator TTFT {TTFT_MS:g} ms, interval 1s.\n\n{table}", command
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
