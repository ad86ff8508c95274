"""What known-answer probes cost the engine (docs/design.md §14.5), measured on a real
llama.cpp server: the engine's own token counters (``llamacpp:prompt_tokens_total``,
``llamacpp:tokens_predicted_total``) around ``--count`` plain probes and ``--count``
known-answer probes at the defaults (prompt "The capital of France is", 3 tokens), sent
one after another by the project's ``MicroProbe``, then scaled to one endpoint-hour at
the default pace (``interval`` 1 s, ``verify.every`` 30 s: 120 of 3,600 probes an hour
are known-answer probes, in place of plain ones).

Needs the engine build (``make test-engine`` once; ``$LLM_HEALTH_ENGINE`` or the default
cache directory):

    .venv/bin/python bench/verify_cost.py --count 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from common import write_result  # noqa: E402
from llm_health.config.schema import ProbeSettings  # noqa: E402
from llm_health.engines.settings import VerifyConfig  # noqa: E402
from llm_health.probe.client import MicroProbe, new_connections  # noqa: E402
from llm_health.probe.signals import await_started  # noqa: E402
from llm_health.probe.target import ProbeTarget  # noqa: E402
from tests.engine.llama import ENGINE_ENV, LlamaServer, server_binary  # noqa: E402
from tests.engine.make_model import ensure_model  # noqa: E402

DEFAULT_ENGINE = Path.home() / ".cache/llm-health/engine/llama-cpp-python-0.3.36"
COUNTERS = ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total")
PER_HOUR = 3600  # probes per endpoint-hour at interval 1 s
VERIFIES_PER_HOUR = 120  # verify.every 30 s


async def measure(
    target: ProbeTarget, server: LlamaServer, count: int, verify: bool
) -> dict[str, float]:
    before = server.metrics()
    async with new_connections() as connections:
        prober = MicroProbe(connections, engines={target.key: "llamacpp"})
        for _ in range(count):
            result = await (
                await_started(partial(prober.start_verify, target, VerifyConfig()))
                if verify
                else await_started(partial(prober.start_probe, target))
            )
            if result.outcome.value != "fast":
                raise SystemExit(f"probe not FAST: {result}")
            await asyncio.sleep(0.05)
    after = server.metrics()
    return {name: (after.get(name, 0.0) - before.get(name, 0.0)) / count for name in COUNTERS}


async def main_async(args: argparse.Namespace) -> str:
    engine = Path(os.environ.get(ENGINE_ENV, DEFAULT_ENGINE))
    workdir = Path(args.workdir)
    server = LlamaServer(workdir, engine, ensure_model(engine, 1), alias="tiny-llama").start()
    try:
        target = ProbeSettings(model="tiny-llama", healthy_ttft="2s", timeout="5s").to_target(
            "llama", server.address
        )
        plain = await measure(target, server, args.count, verify=False)
        checked = await measure(target, server, args.count, verify=True)
    finally:
        server.stop()
    prompt_extra = checked[COUNTERS[0]] - plain[COUNTERS[0]]
    predicted_extra = checked[COUNTERS[1]] - plain[COUNTERS[1]]
    lines = [
        "| per probe | prompt tokens | generated tokens |",
        "|---|---|---|",
        f"| plain probe (`hi`, 1 token) | {plain[COUNTERS[0]]:.2f} | {plain[COUNTERS[1]]:.2f} |",
        f"| known-answer probe (defaults) | {checked[COUNTERS[0]]:.2f} | {checked[COUNTERS[1]]:.2f} |",
        f"| difference | {prompt_extra:+.2f} | {predicted_extra:+.2f} |",
        "",
        f"Per endpoint-hour at the defaults ({VERIFIES_PER_HOUR} of {PER_HOUR} probes are "
        f"known-answer probes): {VERIFIES_PER_HOUR * prompt_extra:+.0f} prompt tokens and "
        f"{VERIFIES_PER_HOUR * predicted_extra:+.0f} generated tokens beyond plain probing "
        f"(plain probing itself: {PER_HOUR * plain[COUNTERS[0]]:.0f} prompt and "
        f"{PER_HOUR * plain[COUNTERS[1]]:.0f} generated tokens an hour).",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--workdir", default="/tmp/llm-health-verify-cost")
    args = parser.parse_args()
    if not 1 <= args.count <= 10_000:
        parser.error("--count: 1 to 10,000")
    engine = Path(os.environ.get(ENGINE_ENV, DEFAULT_ENGINE))
    if not server_binary(engine).exists():
        print(f"skipped: no llama.cpp build at {engine} (run `make test-engine` once)")
        return 0
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    body = asyncio.run(main_async(args))
    print(body)
    write_result("verify_cost", body, f"python bench/verify_cost.py --count {args.count}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
