"""Probe cost on the backend, GPU-free: what one micro-probe asks of an engine, and how many
probes a backend gets from a gateway fleet.

1. Per API and ``cache_bust`` mode, real probes (``MicroProbe``) go to a simulator, which
   records what arrived: the prompt (tokens = the simulator's usage count, whitespace
   words; characters next to it), ``max_tokens``, the request body size, and whether the
   probe was cut after its first token (the simulator counts it ``aborted``: no decoding
   beyond token 1).
2. Probes per backend per second with N gateway replicas, each running its own plugin
   (no sharding): measured by running N independent probers against one simulator for
   ``--seconds`` seconds, next to the N / interval it should be, and what that costs in
   prompt and generated tokens per second.

    .venv/bin/python bench/probe_cost.py --replicas 1 3 10 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import Sim  # noqa: E402

from common import write_result  # noqa: E402
from llm_health.config import ProbeSettings  # noqa: E402
from llm_health.model.outcome import ProbeResult  # noqa: E402
from llm_health.probe.client import MicroProbe, new_connections, probe_body  # noqa: E402
from llm_health.probe.scheduler import Scheduler  # noqa: E402
from llm_health.probe.signals import await_started  # noqa: E402
from llm_health.probe.target import ProbeTarget  # noqa: E402
from tests.ports import free_port  # noqa: E402

MODES = [
    (api, bust)
    for api in ("openai-completions", "openai-chat")
    for bust in ("salt", "prefix", "none")
]
PROBES_PER_MODE = 5
#: A user request to compare with: 500 prompt tokens, 200 generated.
USER_PROMPT, USER_OUTPUT = 500, 200


async def stats(session: aiohttp.ClientSession, sim: Sim) -> dict[str, Any]:
    async with session.get(f"{sim.base_url}/sim/stats") as response:
        result: dict[str, Any] = await response.json()
        return result


async def reset(session: aiohttp.ClientSession, sim: Sim) -> None:
    async with session.post(f"{sim.base_url}/sim/stats/reset") as response:
        await response.read()


def words(value: object) -> int:
    """The simulator's token count: whitespace words in every string."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(words(v) for v in value)
    if isinstance(value, dict):
        return sum(words(v) for v in value.values())
    return 0


def text_of(record: dict[str, Any]) -> str:
    if record.get("prompt") is not None:
        return str(record["prompt"])
    return " ".join(str(m.get("content", "")) for m in record.get("messages") or [])


async def per_probe(sim: Sim) -> list[dict[str, Any]]:
    rows = []
    async with aiohttp.ClientSession(trust_env=False) as control, new_connections() as connections:
        for api, bust in MODES:
            settings = ProbeSettings.model_validate(
                {"model": "sim-model", "api": api, "cache_bust": bust}
            )
            target = settings.to_target("cost", sim.address)
            await reset(control, sim)
            prober = MicroProbe(connections)
            start = partial(prober.start_probe, target)
            results = [await await_started(start) for _ in range(PROBES_PER_MODE)]
            await asyncio.sleep(0.2)  # the simulator notices the closed streams
            seen = await stats(control, sim)
            probes = [r for r in seen["recent"] if r["probe"]]
            texts = [text_of(r) for r in probes]
            rows.append(
                {
                    "api": api,
                    "cache_bust": bust,
                    "outcomes": sorted({r.outcome.value for r in results}),
                    "probes": seen["probe_requests"],
                    "prompt_tokens": max(words(t) for t in texts),
                    "prompt_chars": max(len(t) for t in texts),
                    "distinct_prompts": len(set(texts)),
                    "salted": sum(1 for r in probes if r["cache_salt"]),
                    "max_tokens": max(r["max_tokens"] for r in probes),
                    "body_bytes": len(json.dumps(probe_body(target)).encode()),
                    "aborted": seen["aborted"],
                    "completed": seen["completed"],
                }
            )
    return rows


async def fleet(sim: Sim, replicas: int, seconds: float) -> float:
    """Probes/s one backend receives from ``replicas`` independent probers."""
    settings = ProbeSettings.model_validate({"model": "sim-model", "interval": "1s"})
    target = settings.to_target("cost", sim.address)

    def ignore(_t: ProbeTarget, _r: ProbeResult) -> None:
        return None

    async with aiohttp.ClientSession(trust_env=False) as control:
        sessions = [new_connections() for _ in range(replicas)]
        try:
            schedulers = [Scheduler([target], MicroProbe(s).start_probe, ignore) for s in sessions]
            tasks = [asyncio.create_task(s.run()) for s in schedulers]
            await asyncio.sleep(1.5)  # first rounds done
            before = (await stats(control, sim))["probe_requests"]
            await asyncio.sleep(seconds)
            after = (await stats(control, sim))["probe_requests"]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for s in sessions:
                s.close()
    return float(after - before) / seconds


def render_probe(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| api | cache_bust | prompt tokens (sim count) | prompt chars | distinct prompts / probes | cache_salt sent | max_tokens | body bytes | cut after token 1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            r["api"],
            r["cache_bust"],
            str(r["prompt_tokens"]),
            str(r["prompt_chars"]),
            f"{r['distinct_prompts']} / {r['probes']}",
            f"{r['salted']} / {r['probes']}",
            str(r["max_tokens"]),
            str(r["body_bytes"]),
            f"{r['aborted']} / {r['probes']}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_fleet(measured: dict[int, float], prompt_tokens: int) -> str:
    lines = [
        "| gateway replicas N | probes/s per backend: expected N / interval | measured | prompt tokens/s | generated tokens/s | tokens, as user requests/s of 500 in + 200 out |",
        "|---|---|---|---|---|---|",
    ]
    for n in sorted({1, 3, 10, 50, 100} | set(measured)):
        got = f"{measured[n]:.2f}" if n in measured else "—"
        per_user = n * (prompt_tokens + 1) / (USER_PROMPT + USER_OUTPUT)
        lines.append(f"| {n} | {n:.0f} | {got} | {n * prompt_tokens} | {n} | {per_user:.3f} |")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    sim = Sim(free_port(), 1, ("--ttft", "20ms", "--tpot", "10ms")).spawn()
    try:
        await sim.up()
        rows = await per_probe(sim)
        measured = {n: await fleet(sim, n, args.seconds) for n in args.replicas}
    finally:
        sim.stop()
    default = next(
        r for r in rows if r["api"] == "openai-completions" and r["cache_bust"] == "salt"
    )
    probe_table = render_probe(rows)
    fleet_table = render_fleet(measured, default["prompt_tokens"])
    print(probe_table)
    print()
    print(fleet_table)
    body = (
        f"{PROBES_PER_MODE} real probes per mode against the simulator (TTFT 20 ms, one token "
        f"every 10 ms). Tokens are the simulator's count (whitespace words), a stand-in for a "
        f"real tokenizer: a BPE tokenizer splits the 12-hex-digit nonce of `prefix` mode into "
        f"several tokens, and the chat API adds the model's chat template (role markers) to "
        f"every prompt. `salt` keeps the prompt at the configured 'hi' and sends vLLM's "
        f"`cache_salt`, so a probe never hits or pollutes the prefix cache; `none` reuses "
        f"one prompt (cache hits: the probe would not measure prefill). Every probe asks for "
        f"`max_tokens: 1` and closes the stream after the first token.\n\n{probe_table}\n\n"
        f"Fleet: every gateway replica runs its own plugin and probes every backend every "
        f"`interval` (1 s); there is no sharding between replicas yet, so a backend sees N "
        f"probes/s from N replicas. Measured with N independent probers for {args.seconds:g} s "
        f"each; tokens/s use the default mode (completions, salt: "
        f"{default['prompt_tokens']} prompt token, 1 generated).\n\n{fleet_table}"
    )
    command = "python bench/probe_cost.py " + " ".join(sys.argv[1:])
    write_result("probe_cost", body, command)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 3, 10])
    parser.add_argument("--seconds", type=float, default=5.0)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
