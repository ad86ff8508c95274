"""``llm-health probe URL``: one-off micro-probes of a live endpoint, for the 3 a.m. question
"is this backend really serving?". Exit 0 when every probe got a token (FAST or SLOW).

Each probe's verdict comes within ``--timeout`` (plus scheduling), whatever the endpoint
does: the reads before the first probe (its model, its engine) are asked side by side and
waited for at most PREFLIGHT_S; what has not answered by then is given up, said so, and
the probes go without it (no "model"; the default cache bypass, a nonce prefix).

Every ``--header`` value is a secret: never printed, and redacted from whatever the
endpoint answers (its model id, its errors) before it is shown (docs/design.md §10)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from llm_health.cli.argtypes import duration, positive_int
from llm_health.cli.commands import summary
from llm_health.cli.text import ms
from llm_health.engines.detect import INFO_PATHS
from llm_health.engines.side_reads import READ_ERRORS, SideReads, open_connections
from llm_health.model.outcome import SUCCESSES, ProbeResult
from llm_health.model.redact import redact_secrets, secret_forms
from llm_health.probe.client import MicroProbe, cache_bust_for, new_connections
from llm_health.probe.signals import await_started
from llm_health.probe.target import (
    API_PATHS,
    DEFAULT_FATAL_PATTERNS,
    ProbeTarget,
    compile_fatal_patterns,
)

# How long the probes wait for the model and the engine: a serving engine answers these
# reads in milliseconds, while each may take MAX_SIDE_TIMEOUT_S (2 s) and detection asks
# up to four paths in turn, which held a wedged endpoint's verdict for 8 s and more.
PREFLIGHT_S = 0.5


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "probe",
        help=summary("probe"),
        description="Send one-token streaming probes to URL and print each probe's outcome "
        "and connect / headers / first-token times. Exit 0 if every probe got a token.",
    )
    parser.add_argument("url", help="base URL (http://host:port) or full endpoint URL")
    parser.add_argument("--api", choices=sorted(API_PATHS), default="openai-completions")
    parser.add_argument("--model", help="model name (default: first of GET /v1/models)")
    parser.add_argument("--count", type=positive_int, default=3, help="probes to send")
    parser.add_argument("--timeout", type=duration, default=0.8, help="e.g. 800ms")
    parser.add_argument("--healthy-ttft", type=duration, default=0.2, help="e.g. 200ms")
    parser.add_argument("--interval", type=duration, default=1.0, help="pause between probes")
    parser.add_argument("--prompt", default="hi")
    parser.add_argument(
        "--cache-bust",
        choices=["auto", "salt", "cache_prompt", "prefix", "none"],
        default="auto",
        help="how the probe bypasses the prefix cache; auto (default): by the engine "
        "detected from its info endpoints, as serve does (docs/engines.md)",
    )
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        type=_header,
        metavar="'NAME: VALUE'",
        help="extra request header (repeatable); values are never printed",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_probe_all(args))
    except KeyboardInterrupt:
        return 130


async def _probe_all(args: argparse.Namespace) -> int:
    url = _probe_url(args.url, args.api)
    async with open_connections() as side, new_connections() as connections:
        reads = SideReads(side)  # connections of their own, as serve's side reads
        model, engine = await _preflight(args, reads, _target(args, url, None))
        target = _target(args, url, model)
        prober = MicroProbe(connections, engines={target.key: engine} if engine else None)
        limit = f"{args.timeout * 1000:g} ms"
        shown = redact_secrets(model, target.secrets) if model else "-"
        bust = cache_bust_for(target, engine)
        print(
            f"probing {url} (api {args.api}, model {shown}, engine {engine or 'unknown'}, "
            f"cache bypass {bust}, timeout {limit})"
        )
        results = []
        for index in range(args.count):
            if index:
                await asyncio.sleep(args.interval)
            result = await await_started(partial(prober.start_probe, target))
            results.append(result)
            print(_line(index + 1, result), flush=True)
    print(_summary(results))
    return 0 if all(r.outcome in SUCCESSES for r in results) else 1


def _target(args: argparse.Namespace, url: str, model: str | None) -> ProbeTarget:
    return ProbeTarget(
        cluster="cli",
        address=urlsplit(url).netloc,
        url=url,
        api=args.api,
        model=model,
        prompt=args.prompt,
        cache_bust=args.cache_bust,
        timeout_s=args.timeout,
        healthy_ttft_s=args.healthy_ttft,
        interval_s=args.interval,
        confirm_delay_s=0.0,
        unhealthy_after=2,
        fatal_patterns=compile_fatal_patterns(DEFAULT_FATAL_PATTERNS),
        headers=dict(args.header),
        secrets=secret_forms(value for _name, value in args.header),
    )


def _probe_url(raw: str, api: str) -> str:
    parts = urlsplit(raw if "://" in raw else f"http://{raw}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        print(f"llm-health probe: error: {raw!r} is not an http(s) URL", file=sys.stderr)
        raise SystemExit(2)
    path = parts.path if parts.path not in ("", "/") else API_PATHS[api]
    return f"{parts.scheme}://{parts.netloc}{path}"


async def _preflight(
    args: argparse.Namespace, reads: SideReads, target: ProbeTarget
) -> tuple[str | None, str | None]:
    """The model (unless ``--model``) and the engine (``--cache-bust auto``), asked side by
    side and waited for PREFLIGHT_S at most; a line for each given up (then None)."""
    model = asyncio.create_task(_discover_model(reads, target)) if not args.model else None
    auto = args.cache_bust == "auto"
    engine = asyncio.create_task(_detect_engine(reads, target)) if auto else None
    asked = [task for task in (model, engine) if task is not None]
    if asked:
        await asyncio.wait(asked, timeout=PREFLIGHT_S)
    for task in asked:
        task.cancel()  # a read still waiting: its connection is closed
    await asyncio.gather(*asked, return_exceptions=True)
    if model is not None and model.cancelled():
        print(_gave_up("model discovery", "no answer from GET /v1/models", "without a model"))
    if engine is not None and engine.cancelled():
        paths = ", ".join(path for path, _engine, _key in INFO_PATHS)
        reason = f"its info endpoints ({paths}, asked in turn) had not answered"
        print(_gave_up("engine detection", reason, "with the default body"))
    return _result(model) or args.model, _result(engine)


def _result(task: asyncio.Task[str | None] | None) -> str | None:
    return None if task is None or task.cancelled() else task.result()


def _gave_up(what: str, reason: str, instead: str) -> str:
    return f"{what} gave up after {PREFLIGHT_S:g} s: {reason}; probing {instead}"


async def _detect_engine(reads: SideReads, target: ProbeTarget) -> str | None:
    """The engine serving ``target``, from its info endpoints (``engines.detect``): the
    cache bypass ``serve`` uses for it (llama.cpp ignores vLLM's ``cache_salt``)."""
    return await reads.engine(target)


async def _discover_model(reads: SideReads, target: ProbeTarget) -> str | None:
    """First model id from GET /v1/models, asked with the probe's headers as ``serve``
    asks (its secrets removed); None (omit "model") if the server won't say."""
    try:
        served = await reads.models(target, "/v1/models")
    except READ_ERRORS:
        return None
    return served[0] if served else None


def _line(number: int, result: ProbeResult) -> str:
    times = "  ".join(
        f"{name} {ms(value)}"
        for name, value in (("connect", result.connect_ms), ("headers", result.headers_ms))
    )
    detail = f"  {result.detail}" if result.detail else ""
    return (
        f"probe {number}: {result.outcome.name:<10} ttft {ms(result.ttft_ms):>9}  {times}{detail}"
    )


def _summary(results: list[ProbeResult]) -> str:
    counts: dict[str, int] = {}
    for result in results:
        counts[result.outcome.value] = counts.get(result.outcome.value, 0) + 1
    tally = ", ".join(f"{n} {name}" for name, n in counts.items())
    ttfts = [r.ttft_ms for r in results if r.ttft_ms is not None]
    spread = (
        f"; ttft p50 {statistics.median(ttfts):.1f} ms, max {max(ttfts):.1f} ms" if ttfts else ""
    )
    return f"{len(results)} probes: {tally}{spread}"


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError("a header is written 'Name: value'")
    return name.strip(), value.strip()
