"""What acting on in-flight silence costs (docs/design.md §2.7, §3.2): extra probes and
state changes, with `act_on_silence` on against off, in the same process, same backends.

Two fleets of simulated backends (one `llm-health sim` process each, many ports):
- healthy: TTFT 50 ms ± 30 ms (well under healthy_ttft 200 ms);
- jittery: TTFT 200 ms ± 100 ms (half the probes pass the silence point; fine, but slow).
For each fleet and setting the real runtime (`build_runtime`: scheduler, micro-probe,
board) probes for `--duration` seconds after warm-up; the script reports overlapping
confirming probes per endpoint-hour, probes per endpoint-second, and state changes per
endpoint-minute.

    .venv/bin/python bench/silence_cost.py --endpoints 50 --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import Sim, load_average  # noqa: E402

from common import free_port_block, write_result  # noqa: E402
from llm_health.app.assemble import build_runtime  # noqa: E402
from llm_health.config import Config  # noqa: E402
from llm_health.model.machine import Transition  # noqa: E402
from llm_health.model.outcome import ProbeResult  # noqa: E402
from tests.ports import free_port  # noqa: E402

FLEETS = {"healthy": ("50ms", "30ms"), "jittery": ("200ms", "100ms")}


def make_config(addresses: list[str], act: bool) -> Config:
    return Config.model_validate(
        {
            "server": {"grpc": f"127.0.0.1:{free_port()}", "http": f"127.0.0.1:{free_port()}"},
            "probe": {
                "interval": "1s",
                "timeout": "800ms",
                "healthy_ttft": "200ms",
                "model": "sim-model",
                "act_on_silence": act,
            },
            "clusters": [{"name": "fleet", "endpoints": [{"address": a} for a in addresses]}],
        }
    )


async def run_one(
    addresses: list[str], act: bool, warmup_s: float, duration_s: float
) -> dict[str, Any]:
    runtime = build_runtime(make_config(addresses, act))
    changes: list[tuple[str, Transition]] = []
    probes: list[ProbeResult] = []
    recording = False

    def on_transition(_c: str, address: str, t: Transition, _r: ProbeResult | None) -> None:
        if recording and t.changed:
            changes.append((address, t))

    def on_probe(_c: str, _a: str, result: ProbeResult) -> None:
        if recording:
            probes.append(result)

    runtime.control.on_transition(on_transition)
    runtime.control.on_probe(on_probe)
    stop = asyncio.Event()
    task = asyncio.create_task(runtime.run(stop))
    try:
        await asyncio.sleep(warmup_s)
        overlaps0 = runtime.stats.overlapping_confirms
        recording, started = True, time.monotonic()
        await asyncio.sleep(duration_s)
        recording, wall = False, time.monotonic() - started
        overlaps = runtime.stats.overlapping_confirms - overlaps0
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    n = len(addresses)
    return {
        "act_on_silence": act,
        "overlaps_per_endpoint_hour": overlaps / n / wall * 3600,
        "probes_per_endpoint_s": len(probes) / n / wall,
        "changes_per_endpoint_min": len(changes) / n / wall * 60,
        "silent_changes": sum(1 for _, t in changes if t.cause.value == "silent"),
        "undone_silences": _undone(changes),
    }


def _undone(changes: list[tuple[str, Transition]]) -> int:
    """Silences whose own probe then counted FAST (the endpoint's next change is the
    return to HEALTHY, cause recovered): the changes the rule added."""
    last: dict[str, Transition] = {}
    undone = 0
    for address, t in changes:
        before = last.get(address)
        if before is not None and before.cause.value == "silent" and "after all" in t.after.reason:
            undone += 1
        last[address] = t
    return undone


async def main(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    for fleet, (ttft, jitter) in FLEETS.items():
        if args.fleets and fleet not in args.fleets:
            continue
        base = free_port_block(args.endpoints)
        sim = Sim(base, args.endpoints, ("--ttft", ttft, "--ttft-jitter", jitter, "--seed", "3"))
        sim.spawn()
        try:
            await sim.up(60)
            addresses = [f"127.0.0.1:{base + i}" for i in range(args.endpoints)]
            for act in (False, True):
                row = await run_one(addresses, act, args.warmup, args.duration)
                rows.append({"fleet": fleet, **row})
                print(rows[-1], flush=True)
        finally:
            sim.stop()
    command = (
        f"python bench/silence_cost.py --endpoints {args.endpoints} --duration {args.duration:g}"
    )
    lines = [
        f"Load average at the end: {load_average()}.",
        "",
        "| fleet | act_on_silence | overlapping confirms / endpoint-hour | probes / endpoint-s "
        "| state changes / endpoint-min | of which `silent` | silences undone by the token |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['fleet']} | {str(r['act_on_silence']).lower()} "
            f"| {r['overlaps_per_endpoint_hour']:.1f} | {r['probes_per_endpoint_s']:.3f} "
            f"| {r['changes_per_endpoint_min']:.2f} | {r['silent_changes']} "
            f"| {r['undone_silences']} |"
        )
    text = "\n".join(lines)
    print(text)
    write_result("silence_cost", text, command)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, default=50)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--fleets", nargs="+", choices=list(FLEETS), default=list(FLEETS))
    asyncio.run(main(parser.parse_args()))
