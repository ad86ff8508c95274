"""What the engine checks' side reads cost the prober's loop (docs/design.md §16.5),
each piece side by side with the code it replaced, in this one run:

1. Reading the load out of a /metrics document (``engines.metrics.parse_load``): the
   lines found with ``str.find`` (today) against the line-by-line selection before it
   (``old_select``, kept in tests/unit/engines/test_metrics_select.py as the oracle).
   The documents: the simulator's own /metrics (vLLM names; fetched from a real
   ``llm-health sim``), and the same with ``--histograms`` more histograms of its shape
   (an engine's document is mostly histograms nobody here reads). With and without the
   TTFT histogram, which is parsed on every 5th read only (``with_ttft``): the mean per
   read is weighted so.
2. The 0.25 s tick that starts the due reads (``EngineChecks._tick``): the queue of each
   endpoint's soonest read (today) against looking at every endpoint every tick
   (``old_tick``, kept in tests/unit/engines/test_side_read_queue.py), for
   ``--endpoints`` endpoints with /metrics and /v1/models checks, reads written down
   instead of run (the same in both).

CPU is ``time.process_time``; each figure is the best of ``--repeat`` runs.

    .venv/bin/python bench/side_read_cost.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import Sim  # noqa: E402

from common import free_port_block, write_result  # noqa: E402
from llm_health.config import parse_config  # noqa: E402
from llm_health.engines import metrics  # noqa: E402
from llm_health.engines.schedule import MAX_TICK_S, TTFT_HISTOGRAM_EVERY  # noqa: E402
from tests.fakes import Clock  # noqa: E402
from tests.unit.engines.test_metrics_select import old_select  # noqa: E402
from tests.unit.engines.test_side_read_queue import Recorded  # noqa: E402


def simulator_document() -> str:
    port = free_port_block(1)
    sim = Sim(port, 1, ("--ttft", "20ms")).spawn()
    try:
        asyncio.run(sim.up(30))
        with urllib.request.urlopen(f"{sim.base_url}/metrics", timeout=5) as answer:
            return str(answer.read().decode())
    finally:
        sim.stop()


def larger(document: str, histograms: int) -> str:
    """``document`` with ``histograms`` copies of its end-to-end latency histogram under
    other names (series nobody here reads)."""
    lines = [line for line in document.splitlines() if "e2e_request_latency" in line]
    copies = (
        "\n".join(line.replace("e2e_request_latency", f"extra{i}_latency") for line in lines)
        for i in range(histograms)
    )
    return document + "\n".join(copies) + "\n"


def best_us(run: Callable[[], object], number: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(number):
            run()
        best = min(best, (time.process_time() - start) / number)
    return best * 1e6


def parse_us(document: str, *, ttft: bool, old: bool, repeat: int) -> float:
    new = metrics._select
    metrics._select = old_select if old else new  # type: ignore[assignment]
    try:
        return best_us(lambda: metrics.parse_load(document, ttft=ttft), 500, repeat)
    finally:
        metrics._select = new  # type: ignore[assignment]


def per_read(light: float, full: float) -> float:
    """The mean per read: the TTFT histogram on one read in TTFT_HISTOGRAM_EVERY."""
    return (light * (TTFT_HISTOGRAM_EVERY - 1) + full) / TTFT_HISTOGRAM_EVERY


def parse_rows(documents: dict[str, str], repeat: int) -> list[str]:
    rows = []
    for label, document in documents.items():
        cost = {
            (old, ttft): parse_us(document, ttft=ttft, old=old, repeat=repeat)
            for old in (True, False)
            for ttft in (False, True)
        }
        before = per_read(cost[(True, False)], cost[(True, True)])
        after = per_read(cost[(False, False)], cost[(False, True)])
        rows.append(
            f"| {label} | {document.count(chr(10))} | {cost[(True, False)]:.0f} → "
            f"{cost[(False, False)]:.0f} µs | {cost[(True, True)]:.0f} → {cost[(False, True)]:.0f}"
            f" µs | {before:.0f} → {after:.0f} µs | {before / after:.1f}× |"
        )
    return rows


def endpoints_config(count: int) -> str:
    endpoints = ", ".join(f'{{address: "127.0.0.1:{10_000 + i}"}}' for i in range(count))
    return (
        f"probe: {{model: m}}\nclusters:\n  - name: c\n    model: m\n    endpoints: [{endpoints}]\n"
    )


def tick_us(count: int, *, old: bool, ticks: int, repeat: int) -> tuple[float, float]:
    """(CPU µs per tick, reads started per second) at ``count`` endpoints."""
    config = parse_config(endpoints_config(count), "bench.yaml", {})
    clock = Clock()
    side = Recorded(clock, {"now": config})
    for _ in range(40):  # every endpoint placed, the first reads behind
        clock.now += MAX_TICK_S
        side.tick(old=old)
    started = 0

    def one() -> None:
        nonlocal started
        clock.now += MAX_TICK_S
        started += sum(side.tick(old=old).values())

    cost = best_us(one, ticks, repeat)
    return cost, started / (ticks * repeat * MAX_TICK_S)


def tick_rows(counts: list[int], repeat: int) -> list[str]:
    rows = []
    for count in counts:
        before, rate = tick_us(count, old=True, ticks=100, repeat=repeat)
        after, _ = tick_us(count, old=False, ticks=100, repeat=repeat)
        share = 100 / MAX_TICK_S / 1e6
        rows.append(
            f"| {count} | {rate:.0f} | {before:.0f} → {after:.0f} µs | "
            f"{before * share:.2f} → {after * share:.2f} % | {before / after:.1f}× |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--histograms", type=int, default=12)
    parser.add_argument("--endpoints", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    document = simulator_document()
    documents = {
        "simulator (vLLM names)": document,
        f"simulator + {args.histograms} histograms": larger(document, args.histograms),
    }
    body = "\n".join(
        [
            "Side by side in one run, CPU (`time.process_time`), best of "
            f"{args.repeat}. Before → after.",
            "",
            "## Reading the load out of /metrics (`parse_load`)",
            "",
            "| document | lines | without TTFT histogram | with it | mean per read "
            f"(1 in {TTFT_HISTOGRAM_EVERY} with it) | faster |",
            "|---|---|---|---|---|---|",
            *parse_rows(documents, args.repeat),
            "",
            "## The side reads' tick (every 0.25 s)",
            "",
            "| endpoints | reads started / s | CPU per tick | of a core | faster |",
            "|---|---|---|---|---|",
            *tick_rows(args.endpoints, args.repeat),
        ]
    )
    print(body)
    command = "python bench/side_read_cost.py " + " ".join(sys.argv[1:])
    print(f"\nwritten to {write_result('side_read_cost', body, command.strip())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
