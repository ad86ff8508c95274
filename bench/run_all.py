"""``make bench``: run every benchmark, one after the other, within a time budget.

The known benchmarks run first with the arguments that keep the whole set within the
default budget on 2 cores; any other ``bench/*.py`` benchmark that appears later (e.g. by
another issue) runs after them with its own defaults. Helpers are skipped. Each writes
its table (and plot) to ``bench/results/``. A benchmark that fails or overruns the
remaining budget is reported and makes the exit status 1; the others still run.

    .venv/bin/python bench/run_all.py [--budget 1680] [--only detection push_latency]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
#: Known benchmarks in run order, with the arguments used by `make bench` (~25 minutes:
#: ~13 (detection ~6 of it), plus ~2.5 for discovery, ~3.5 for fleet and ~5 for passive).
PLAN: list[tuple[str, list[str]]] = [
    ("detection", []),
    ("probe_scale", ["--profile", "1000"]),
    ("push_latency", []),
    ("push_latency", ["--coalesce", "0", "--endpoints", "1", "1000", "5000"]),
    ("probe_cost", []),
    ("probe_client_cost", []),  # ~1 min
    ("authz_overhead", []),
    ("discovery", ["--cpu-seconds", "20"]),
    # 1,000 endpoints overload one replica on 2 cores today (bench/results/fleet.md):
    # `make bench` measures the 100-endpoint fleets; run bench/fleet.py alone for the rest.
    ("fleet", ["--endpoints", "100", "--events", "12", "--trials", "3"]),
    # Its defaults (~4.7 min): 2 modes x (50 s of probe counting + 5 zombie trials) + 43 s CPU.
    ("passive", []),
    # ~10 s; needs the llama.cpp build of `make test-engine` (skips itself without it).
    ("verify_cost", ["--count", "50"]),
]
#: Modules in bench/ that are not benchmarks (or are superseded by one in PLAN).
HELPERS = {"common", "procs", "route_probe", "run_all", "probe_accuracy"}


def benchmarks(only: list[str] | None) -> list[tuple[str, list[str]]]:
    present = {p.stem for p in BENCH.glob("*.py")} - HELPERS
    known = {name for name, _ in PLAN}
    runs = [(name, args) for name, args in PLAN if name in present]
    runs += [(name, []) for name in sorted(present - known)]
    return [(name, args) for name, args in runs if not only or name in only]


def run_one(command: list[str], env: dict[str, str], timeout_s: float) -> str:
    """Run one benchmark in its own process group. On overrun: SIGINT (its ``finally``
    blocks stop the simulators and Envoys it started), then SIGKILL to its group."""
    child = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    try:
        code = child.wait(timeout_s)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        return "overran the budget"
    return "ok" if code == 0 else f"exit {code}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget", type=float, default=1680.0, help="seconds for all of them")
    parser.add_argument("--only", nargs="+", default=None, help="benchmark names to run")
    args = parser.parse_args()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "plugin"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        ),
        "PYTHONUNBUFFERED": "1",
    }
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min)", flush=True)
    deadline = time.monotonic() + args.budget
    summary = []
    for name, extra in benchmarks(args.only):
        left = deadline - time.monotonic()
        if left <= 10:
            summary.append((name, "not run: budget spent", 0.0))
            continue
        print(f"\n=== {name} {' '.join(extra)} (budget left {left:.0f} s)", flush=True)
        started = time.monotonic()
        status = run_one([sys.executable, str(BENCH / f"{name}.py"), *extra], env, left)
        summary.append((name, status, time.monotonic() - started))
    print("\n| benchmark | status | seconds |\n|---|---|---|")
    for name, status, seconds in summary:
        print(f"| {name} | {status} | {seconds:.0f} |")
    return 0 if all(status == "ok" for _, status, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
