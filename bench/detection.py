"""Detection benchmark: llm-health against the health checks an operator already has.

Five ways of health-checking the same kind of gateway, run side by side, CONCURRENTLY:
five independent stacks, each its own 3 simulator backends and its own real Envoy (the
shipped ``sidecar-ads.yaml`` listener, route, LEAST_REQUEST, panic threshold 0, update
merge window 0), each under the same steady user load (non-streamed completions, or
streamed chat for the role-chunk scenario), with the same fault injected into backend 0
of every stack at the same instant:

- ``llm-health``: the plugin (``llm-health serve``) over ADS/EDS, default probe settings
  except ``probe.verify.every: 5s`` (below), with the cluster's ``model: sim-model`` (the
  served-model check needs it), the default ``engine_metrics`` (/metrics every 1 s,
  queue >= 5 or KV cache >= 0.8: DEGRADED, weight 30 %), and the shipped bootstrap's
  access-log stream to the plugin (passive health: ``probe.quality``, on by default;
  the sanity section shows how many user requests the plugin counted from it);
- ``hc-get``: Envoy active HTTP health check ``GET /health``;
- ``hc-post``: Envoy active HTTP health check that POSTs a 1-token completion
  (``method: POST`` + ``send``, non-streamed: Envoy reads the whole answer and judges by
  the status code);
- ``outlier``: Envoy outlier detection only (consecutive 5xx / gateway failures; the
  route gets a 5 s timeout so a hang becomes a 504 it can count);
- ``metrics-only``: an endpoint picker in the manner of the Gateway API Inference
  Extension's (EPP), judging backends by their engine metrics alone, no probes. A small
  scraper in this process (its own thread and event loop, aiohttp) reads each backend's
  ``/metrics`` every 50 ms and takes a backend out of rotation while
  ``vllm:num_requests_waiting >= 5``, or ``vllm:kv_cache_usage_perc >= 0.8``, or its
  metrics are stale (no successful scrape for 200 ms); back in when none holds
  (``picker_in``). These are the thresholds this benchmark sets, not any EPP release's
  defaults, and it is not the EPP's code (no prefix-cache or LoRA scoring: only its
  "is this endpoint usable" filters). How it reaches Envoy: the real EPP picks the
  endpoint per request over ext_proc; emulated here with Envoy's own active HTTP health
  check pointed at a judge server of the scraper's thread (every endpoint's
  ``health_check_config`` sends the check to the judge's port with ``Host: backend-<i>``;
  the judge answers 200 or 503 from the scraper's verdict at that instant), interval
  100 ms, timeout 100 ms, unhealthy_threshold 1, healthy_threshold 1. So Envoy follows
  the scraper's verdict within ~100-150 ms (check interval + one round trip), with no
  hysteresis either way; a real EPP reading its datastore per request would follow it
  up to that much sooner (at 20 req/s, about one request per verdict change). The
  sanity section reports the scraper's own verdict changes, its scrapes and failures,
  and the largest gap between two checks Envoy sent the judge.

The Envoy checkers mirror llm-health's defaults: interval 1 s, timeout 800 ms,
unhealthy_threshold 2, healthy_threshold 3.

``probe.verify.every: 5s`` for llm-health (default 30 s): the known-answer probe (garbage
output) and the served-model check (``GET /v1/models``) run every ``verify.every``, and an
endpoint held UNHEALTHY by either is released only by the next passing check, then the
usual hysteresis. At 30 s the garbage and wrong-model scenarios would need up to 30 s of
fault to be sure to see a check and 30 s + 3 probes after the heal to see it back: at
least ~66 s per scenario with the 3 s lead, over this benchmark's 60 s bound and far over
its 25 s. At 5 s both fit the default 12 s fault / 10 s heal. The setting is the same in
every scenario (a known-answer probe replaces one of the scheduled probes, it adds none).

Per scenario and method it measures, from Envoy's access log (which upstream got which
request), the client's own records and Envoy's admin ``/clusters`` polled every 100 ms:
time from fault to isolation (the last user request routed to the faulty backend), user
requests hurt, the faulty backend's share of the traffic while faulty, the state changes
Envoy applied (false alarms in the healthy baseline and the flapping scenario), and the
time from heal to full traffic again.

What "hurt" means: a user request that failed (non-200, broken stream, connection error)
or stalled (no answer, or first token, within 5 s). In three scenarios the faulty
backend answers 200 on time and the harm is in what it serves, so there a request routed
to the faulty backend while faulty (sent between fault and heal; Envoy's access log) is
hurt too, even if it got a 200:

- ``garbage`` (fault ``garbage_tokens``: fast, well-formed answers that are all "!",
  vLLM's NaN-logits symptom): the user got garbage (the client also checks the text:
  the sanity section counts the all-"!" answers users saw);
- ``wrong-model`` (``served_model`` another id: wrong weights behind the right name, the
  answer looks normal): the user was served by the wrong model;
- ``saturated`` (``/metrics`` says 12 requests waiting; service is NOT slowed, the
  simulator only reports the queue): the request joined a queue of 12 on a real engine.
  Notional harm: read it as the faulty backend's traffic while saturated (the share
  table), which metrics-based methods should cut and Envoy's checks cannot see.

    .venv/bin/python bench/detection.py                    # every scenario, ~6 min
    .venv/bin/python bench/detection.py --scenarios zombie cuda --fault-seconds 8

Timeline per scenario (scaled down from the issue's 60 s so all fits ``make bench``):
``--lead`` s of normal traffic, ``--fault-seconds`` s faulty, ``--heal-seconds`` s after
the heal, at ``--rate`` requests/s per stack throughout (every loop bounded in count). In
the crash scenario the heal is a process restart; it counts from when the new process
listens (seconds later on a busy machine, at most 30 s), and the load runs on
``--heal-seconds`` after that.

``--trials N`` (N > 1) repeats each scenario N times on the same stacks, each trial with
the fault at a random phase within one probe interval after the lead time (seeded by
``--seed``), each from a healthy steady state, and reports p50 / p90 / max over the
trials into ``results/detection_trials.md`` (``--output``) instead:

    .venv/bin/python bench/detection.py --scenarios zombie role-hang --methods llm-health \\
        --trials 10 --fault-seconds 6 --heal-seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import Sim, child_env, load_average  # noqa: E402

from common import RESULTS, free_port_block, write_result  # noqa: E402
from tests.envoy_harness import (  # noqa: E402
    XDS_CLUSTER,
    EnvoyProcess,
    listeners,
    parse_host_statuses,
    render_config,
    routes,
    walk,
)
from tests.ports import free_port  # noqa: E402
from tests.processes import PluginProcess  # noqa: E402

CLUSTER = "llama-70b"
SHIPPED = ROOT / "envoy-configs" / "sidecar-ads.yaml"
METHODS = {
    "llm-health": "llm-health (EDS)",
    "hc-get": "Envoy HC GET /health",
    "hc-post": "Envoy HC POST 1-token",
    "outlier": "outlier detection",
    "metrics-only": "metrics-only picker",
}
BACKENDS = 3
BASE_TTFT = "50ms"
SIM_ARGS = ("--ttft", BASE_TTFT, "--tpot", "5ms")
USER_MAX_TOKENS = 8
STALL_S = 5.0  # no answer (or first token) within this: the user is "stalled"
CLIENT_TIMEOUT_S = 5.5  # a bit above STALL_S, so stalls are seen, bounded
POLL_S = 0.1
PROBE_INTERVAL_S = 1.0  # llm-health's and both Envoy checkers' interval: the fault phase range
STEADY_HOLD_S = 1.0  # between trials: all healthy this long in a row before the next one
STEADY_TIMEOUT_S = 30.0
HEAL = {
    "fault": "none",
    "ttft": BASE_TTFT,
    "ttft_jitter": "0ms",
    "fault_rate": 1.0,
    "load_ttft_per_request": "20ms",
    "startup_delay": "30s",
    "served_model": None,
    "metrics": "ok",
    "metrics_waiting": None,
    "metrics_kv_cache": None,
}
#: Host flags of Envoy's /clusters that keep a host out of load balancing.
OUT_FLAGS = frozenset(
    {
        "failed_active_health_check",
        "failed_outlier_check",
        "failed_eds_health",
        "pending_active_hc",
        "excluded_via_immediate_hc_fail",
    }
)
ACCESS_FORMAT = {
    "start": "%START_TIME(%s.%3f)%",
    "host": "%UPSTREAM_HOST%",
    "code": "%RESPONSE_CODE%",
    "flags": "%RESPONSE_FLAGS%",
    "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
    "id": "%REQ(X-BENCH-ID)%",
}
OUTLIER = {
    "consecutive_5xx": 5,
    "consecutive_gateway_failure": 5,
    "enforcing_consecutive_gateway_failure": 100,
    "interval": "1s",
    "base_ejection_time": "10s",
    "max_ejection_percent": 50,
}
OUTLIER_ROUTE_TIMEOUT = "5s"
#: How the crash scenario's heal is timed (in the report).
RESTART_NOTE = (
    "crash: the heal instant is when the restarted backend's port accepts connections "
    "(a new simulator process takes seconds to start on a busy machine; the time is in "
    "the sanity section), and the load runs on --heal-seconds after that"
)
#: llm-health's known-answer / served-model check period here (default 30 s; docstring).
VERIFY_EVERY = "5s"
#: The metrics-only picker (docstring): scrape period, scrape timeout, and its rule.
PICKER_SCRAPE_S = 0.05
PICKER_SCRAPE_TIMEOUT_S = 0.5
PICKER_QUEUE = 5.0  # vllm:num_requests_waiting at or above: out
PICKER_KV = 0.8  # vllm:kv_cache_usage_perc at or above: out
PICKER_STALE_S = 0.2  # no successful scrape for this long: out
#: Envoy's active check of the picker's judge: how fast Envoy follows its verdict.
PICKER_CHECK = {
    "timeout": "0.1s",
    "interval": "0.1s",
    "no_traffic_interval": "0.1s",
    "unhealthy_threshold": 1,
    "healthy_threshold": 1,
    "http_health_check": {"path": "/verdict"},
}


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    fault: dict[str, Any] | None  # POST /sim/fault body at the fault instant; None: crash
    chat: bool = False  # users stream chat completions; probes/checks use chat too
    #: Non-empty: the faulty backend answers on time but a request it serves while faulty
    #: is hurt anyway (this says how); it counts with the failed and stalled ones.
    served_hurts: str = ""


def scenarios(fault_s: float) -> list[Scenario]:
    return [
        Scenario("healthy", "healthy baseline, no fault", {}),
        Scenario(
            "zombie", "zombie: hang after headers, /health 200", {"fault": "hang_after_headers"}
        ),
        Scenario(
            "role-hang",
            "hang after the chat role chunk (users stream chat)",
            {"fault": "hang_after_role_chunk"},
            chat=True,
        ),
        Scenario("cuda", "CUDA error: 500 EngineDeadError", {"fault": "cuda_error"}),
        Scenario("slow", "slow: TTFT 500 ms", {"ttft": "500ms"}),
        Scenario(
            "overload",
            "overload: TTFT +200 ms per request in flight",
            {"fault": "slow_under_load", "load_ttft_per_request": "200ms"},
        ),
        Scenario(
            "flapping", "flapping: TTFT 200 ms ± 100 ms", {"ttft": "200ms", "ttft_jitter": "100ms"}
        ),
        Scenario(
            "cold-start",
            f"cold start: 503 'model loading' for {fault_s:g} s",
            {"fault": "startup_delay", "startup_delay": f"{fault_s:g}s"},
        ),
        Scenario("crash", "crash (connection refused), then restart", None),
        Scenario(
            "garbage",
            "garbage tokens: fast 200s of '!!!!' (NaN logits)",
            {"fault": "garbage_tokens"},
            served_hurts="garbage",
        ),
        Scenario(
            "wrong-model",
            "wrong model: /v1/models lists org/other-model",
            {"served_model": "org/other-model"},
            served_hurts="wrong model",
        ),
        Scenario(
            "saturated",
            "saturated: /metrics says 12 waiting (service normal)",
            {"metrics_waiting": 12},
            served_hurts="queued",
        ),
    ]


# --------------------------------------------------------------------------- Envoy configs


GRPC_LOGGER = "envoy.access_loggers.http_grpc"


def set_access_log(config: dict[str, Any], path: Path, keep_grpc: bool = False) -> None:
    """One JSON line per request (which upstream, when, outcome) into ``path``, instead of
    the shipped stdout logger; the shipped access-log stream to the plugin (passive
    health) is kept with ``keep_grpc`` (method llm-health), dropped otherwise (no plugin)."""
    logger = {
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(path),
            "log_format": {"json_format": ACCESS_FORMAT},
        },
    }
    for node in walk(listeners(config)):
        if node.get("stat_prefix") and "route_config" in node:
            shipped = node.get("access_log") or []
            kept = [a for a in shipped if keep_grpc and a.get("name") == GRPC_LOGGER]
            node["access_log"] = [*kept, logger]


def health_check(http: dict[str, Any]) -> dict[str, Any]:
    """Envoy's active HTTP check with llm-health's default timing and thresholds."""
    return {
        "timeout": "0.8s",
        "interval": "1s",
        "no_traffic_interval": "1s",
        "unhealthy_threshold": 2,
        "healthy_threshold": 3,
        "http_health_check": http,
    }


def post_check(chat: bool, model: str = "sim-model") -> dict[str, Any]:
    """POST a 1-token completion (``send.text`` is hex-encoded, Envoy >= 1.36)."""
    body: dict[str, Any] = {"model": model, "max_tokens": 1, "temperature": 0}
    if chat:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    headers = {"content-type": "application/json", "x-llm-probe": "true"}
    return {
        "path": "/v1/chat/completions" if chat else "/v1/completions",
        "method": "POST",
        "send": {"text": json.dumps(body).encode().hex()},
        "request_headers_to_add": [{"header": {"key": k, "value": v}} for k, v in headers.items()],
    }


def make_static(
    config: dict[str, Any],
    ports: list[int],
    method: str,
    chat: bool,
    judge_port: int = 0,
    model: str = "sim-model",
) -> None:
    """Turn the shipped EDS bootstrap into a static cluster checked by Envoy itself
    (``metrics-only``: checked against the picker's judge on ``judge_port``; ``hc-post``
    asks for ``model``)."""
    config.pop("dynamic_resources", None)
    resources = config["static_resources"]
    resources["clusters"] = [c for c in resources["clusters"] if c["name"] != XDS_CLUSTER]
    cluster = next(c for c in resources["clusters"] if c["name"] == CLUSTER)
    cluster["type"] = "STATIC"
    cluster.pop("eds_cluster_config", None)
    hosts: list[dict[str, Any]] = [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
        for p in ports
    ]
    cluster["load_assignment"] = {"cluster_name": CLUSTER, "endpoints": [{"lb_endpoints": hosts}]}
    if method == "hc-get":
        cluster["health_checks"] = [health_check({"path": "/health"})]
    elif method == "hc-post":
        cluster["health_checks"] = [health_check(post_check(chat, model))]
    elif method == "metrics-only":
        if not judge_port:
            raise ValueError("metrics-only needs the picker's judge port")
        cluster["health_checks"] = [json.loads(json.dumps(PICKER_CHECK))]
        for i, host in enumerate(hosts):
            host["endpoint"]["health_check_config"] = {
                "port_value": judge_port,
                "hostname": f"backend-{i}",
            }
    else:
        cluster["outlier_detection"] = dict(OUTLIER)
        for route in routes(config):
            route["route"]["timeout"] = OUTLIER_ROUTE_TIMEOUT


# --------------------------------------------------------------------------- metrics-only


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")
PICKER_WAITING = "vllm:num_requests_waiting"
PICKER_KV_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def picker_metrics(text: str) -> tuple[float, float | None]:
    """(requests waiting, KV-cache usage or None) from a vLLM Prometheus document: the
    sum of the waiting series, the fullest KV-cache series. ValueError if there is no
    waiting series or a value of either is not a finite number (a failed scrape)."""
    waiting: float | None = None
    kv: float | None = None
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None or (name := match.group(1)) not in (PICKER_WAITING, *PICKER_KV_NAMES):
            continue
        value = float(match.group(2))
        if not math.isfinite(value):
            raise ValueError(f"{name} is {match.group(2)}")
        if name == PICKER_WAITING:
            waiting = (waiting or 0.0) + value
        else:
            kv = value if kv is None else max(kv, value)
    if waiting is None:
        raise ValueError(f"no {PICKER_WAITING}")
    return waiting, kv


def picker_in(queue: float | None, kv: float | None, since_scrape_s: float | None) -> bool:
    """The metrics-only picker's rule: a backend is in rotation unless its queue is at or
    over PICKER_QUEUE, its KV cache at or over PICKER_KV, or its metrics are stale (no
    successful scrape yet, or none for PICKER_STALE_S). No KV figure: judged on the rest."""
    if since_scrape_s is None or since_scrape_s >= PICKER_STALE_S:
        return False
    if queue is None or queue >= PICKER_QUEUE:
        return False
    return kv is None or kv < PICKER_KV


@dataclass
class _Scraped:
    queue: float | None = None
    kv: float | None = None
    at: float | None = None  # monotonic time of the last successful scrape
    scrapes: int = 0
    failures: int = 0
    verdict: bool | None = None  # the last one the judge gave
    changes: int = 0  # verdict changes the judge gave (the first verdict not counted)
    checks: int = 0
    last_check: float | None = None
    max_gap_s: float = 0.0  # largest time between two checks Envoy sent the judge


class Picker:
    """Scraper + judge of the metrics-only method, in its own thread and event loop (so
    the benchmark's user load cannot delay a 100 ms judge answer). ``start`` returns the
    judge's port; ``stop`` ends the thread. Its figures are read after ``stop``."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.backends = [_Scraped() for _ in ports]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._port = 0
        self._error: BaseException | None = None

    def start(self) -> int:
        self._thread = threading.Thread(target=self._main, name="picker", daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            self.stop()
            raise RuntimeError(f"picker did not start: {self._error!r}")
        return self._port

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10)

    @property
    def changes(self) -> int:
        return sum(b.changes for b in self.backends)

    def sanity(self) -> str:
        scrapes = sum(b.scrapes for b in self.backends)
        failures = sum(b.failures for b in self.backends)
        checks = sum(b.checks for b in self.backends)
        gap = max(b.max_gap_s for b in self.backends)
        return (
            f"picker {self.changes} verdict changes, {scrapes} scrapes ({failures} failed), "
            f"{checks} checks judged, max gap {1000 * gap:.0f} ms"
        )

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start(); the thread must not die silently
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_get("/verdict", self._judge)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self._port = int(runner.addresses[0][1])
            timeout = aiohttp.ClientTimeout(total=PICKER_SCRAPE_TIMEOUT_S)
            async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
                scrapers = [
                    asyncio.create_task(self._scrape(session, i)) for i in range(len(self.ports))
                ]
                self._ready.set()
                await self._stop.wait()
                for task in scrapers:
                    task.cancel()
                await asyncio.gather(*scrapers, return_exceptions=True)
        finally:
            await runner.cleanup()

    async def _scrape(self, session: aiohttp.ClientSession, i: int) -> None:
        """Every PICKER_SCRAPE_S (a late scrape skips the ticks it missed, never bursts)."""
        url = f"http://127.0.0.1:{self.ports[i]}/metrics"
        state = self.backends[i]
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            state.scrapes += 1
            try:
                async with session.get(url) as response:
                    text = await response.text()
                    if response.status != 200:
                        raise ValueError(f"HTTP {response.status}")
                state.queue, state.kv = picker_metrics(text)
                state.at = time.monotonic()
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError, UnicodeError):
                state.failures += 1
            due = max(due + PICKER_SCRAPE_S, loop.time())
            await asyncio.sleep(due - loop.time())

    def verdict(self, i: int, now: float) -> bool:
        state = self.backends[i]
        since = None if state.at is None else now - state.at
        return picker_in(state.queue, state.kv, since)

    async def _judge(self, request: web.Request) -> web.Response:
        """Envoy's check of backend <i> (``Host: backend-<i>``): 200 in, 503 out."""
        host = (request.headers.get("Host") or "").split(":")[0]
        try:
            i = int(host.removeprefix("backend-"))
            state = self.backends[i]
        except (ValueError, IndexError):
            return web.Response(status=404, text=f"no backend {host!r}")
        now = time.monotonic()
        verdict = self.verdict(i, now)
        if state.last_check is not None:
            state.max_gap_s = max(state.max_gap_s, now - state.last_check)
        state.last_check, state.checks = now, state.checks + 1
        if state.verdict is not None and verdict != state.verdict:
            state.changes += 1
        state.verdict = verdict
        return web.Response(status=200 if verdict else 503)


# --------------------------------------------------------------------------- one stack


@dataclass
class Request:
    rid: str
    sent: float  # wall clock
    outcome: str  # ok | failed | stalled
    latency_s: float | None
    garbage: bool = False  # a 200 whose text is nothing but "!" (garbage_tokens)


@dataclass
class Stack:
    """Sims + (plugin) + Envoy for one method; views/requests filled during a run."""

    method: str
    sims: list[Sim]
    workdir: Path
    plugin: PluginProcess | None = None
    picker: Picker | None = None
    envoy: EnvoyProcess | None = None
    url: str = ""
    access_log: Path = Path()
    views: list[tuple[float, dict[str, tuple[bool, int]]]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    t_fault: float = 0.0
    t_heal: float = 0.0
    rid_prefix: str = ""  # "t3-" in trial 3 of a --trials run: ids unique in the access log
    own_changes: int | None = None  # state changes the plugin / picker logged in this run
    als_counted: int | None = None  # requests the plugin counted from Envoy's access-log stream

    @property
    def faulty(self) -> str:
        return self.sims[0].address

    async def start(self, scenario: Scenario) -> None:
        self.views, self.requests = [], []
        workdir = self.workdir / scenario.name
        workdir.mkdir(parents=True, exist_ok=True)
        self.access_log = workdir / "access.log"
        xds_port = free_port()
        if self.method == "llm-health":
            self.plugin = PluginProcess(workdir / "plugin", plugin_settings(self, scenario))
            await asyncio.to_thread(self.plugin.start)
            await asyncio.to_thread(self.plugin.wait_ready, 30.0)
            xds_port = self.plugin.grpc_port
        judge_port = 0
        if self.method == "metrics-only":
            self.picker = Picker([s.port for s in self.sims])
            judge_port = await asyncio.to_thread(self.picker.start)
        listener_port = free_port()

        def edit(config: dict[str, Any]) -> None:
            set_access_log(config, self.access_log, keep_grpc=self.method == "llm-health")
            if self.method != "llm-health":
                ports = [s.port for s in self.sims]
                make_static(config, ports, self.method, scenario.chat, judge_port)

        rendered = render_config(
            SHIPPED,
            workdir / "envoy.yaml",
            xds_port=xds_port,
            listener_port=listener_port,
            admin_port=0,
            extra=edit,
        )
        self.envoy = EnvoyProcess(rendered, workdir=workdir / "envoy", ready_timeout=30.0)
        await self.envoy.astart()
        path = "/v1/chat/completions" if scenario.chat else "/v1/completions"
        self.url = f"http://127.0.0.1:{listener_port}{path}"

    async def stop(self) -> None:
        if self.envoy is not None:
            await self.envoy.astop()
        if self.plugin is not None:
            await asyncio.to_thread(self.plugin.stop)
        if self.picker is not None:
            await asyncio.to_thread(self.picker.stop)

    def transitions(self) -> int | None:
        """State changes the plugin logged after warm-up, in all (llm-health), or the
        verdict changes the picker's judge gave (metrics-only); None for the others."""
        if self.picker is not None:
            return self.picker.changes
        if self.plugin is None:
            return None
        return sum(
            1
            for r in self.plugin.log_records()
            if r.get("msg") == "state change" and r.get("from") != "starting"
        )


def plugin_settings(stack: Stack, scenario: Scenario) -> dict[str, Any]:
    api = "openai-chat" if scenario.chat else "openai-completions"
    endpoints = [{"address": s.address} for s in stack.sims]
    return {
        "probe": {"model": "sim-model", "api": api, "verify": {"every": VERIFY_EVERY}},
        "xds": {"warm_start_timeout": "5s"},
        "clusters": [{"name": CLUSTER, "model": "sim-model", "endpoints": endpoints}],
    }


def host_view(clusters_json: dict[str, Any]) -> dict[str, tuple[bool, int]]:
    """address -> (routable, weight) as Envoy's load balancer sees it."""
    view = {}
    for address, host in parse_host_statuses(clusters_json, CLUSTER).items():
        routable = host["eds_health_status"] in ("HEALTHY", "UNKNOWN") and not (
            OUT_FLAGS & set(host["health_flags"])
        )
        view[address] = (routable, host["weight"])
    return view


async def poll_views(session: aiohttp.ClientSession, stack: Stack, stop: asyncio.Event) -> None:
    assert stack.envoy is not None
    url = f"http://{stack.envoy.admin_address}/clusters?format=json"
    while not stop.is_set():
        at = time.time()
        with contextlib.suppress(aiohttp.ClientError, ValueError, KeyError, TimeoutError):
            async with session.get(url) as response:
                stack.views.append((at, host_view(await response.json(content_type=None))))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)


async def wait_all_routable(session: aiohttp.ClientSession, stacks: list[Stack]) -> None:
    """Until every backend of every stack is routable at its full weight (max 30 s)."""
    deadline = time.monotonic() + 30
    pending = list(stacks)
    while pending and time.monotonic() < deadline:
        still = []
        for stack in pending:
            assert stack.envoy is not None
            url = f"http://{stack.envoy.admin_address}/clusters?format=json"
            try:
                async with session.get(url) as response:
                    view = host_view(await response.json(content_type=None))
            except (aiohttp.ClientError, ValueError, KeyError):
                view = {}
            ok = len(view) == BACKENDS and all(r for r, _ in view.values())
            if not ok or len({w for _, w in view.values()}) != 1:
                still.append(stack)
        pending = still
        await asyncio.sleep(0.1)
    if pending:
        raise TimeoutError(f"backends not all routable in {[s.method for s in pending]}")


# --------------------------------------------------------------------------- user load


def user_body(chat: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "sim-model", "max_tokens": USER_MAX_TOKENS}
    if chat:
        body.update(messages=[{"role": "user", "content": "hello"}], stream=True)
    else:
        body["prompt"] = "hello"
    return body


async def first_token(response: aiohttp.ClientResponse) -> bool:
    """Read a chat SSE stream until a chunk carries content; False if it ends first."""
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
            if json.loads(line[5:])["choices"][0]["delta"].get("content"):
                return True
    return False


async def user_request(session: aiohttp.ClientSession, url: str, rid: str, chat: bool) -> Request:
    sent, started = time.time(), time.perf_counter()
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            async with session.post(url, json=user_body(chat), headers={"X-Bench-Id": rid}) as r:
                if r.status != 200:
                    await r.read()
                    return Request(rid, sent, "failed", time.perf_counter() - started)
                if chat and not await first_token(r):
                    return Request(rid, sent, "failed", time.perf_counter() - started)
                latency = time.perf_counter() - started
                body = await r.read()
    except TimeoutError:
        return Request(rid, sent, "stalled", None)
    except (aiohttp.ClientError, OSError):
        return Request(rid, sent, "failed", time.perf_counter() - started)
    outcome = "ok" if latency <= STALL_S else "stalled"
    return Request(rid, sent, outcome, latency, garbage=not chat and is_garbage(body))


def is_garbage(body: bytes) -> bool:
    """A non-streamed completion whose text is nothing but "!" (and white space)."""
    try:
        text = json.loads(body)["choices"][0]["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        return False
    visible = "".join(str(text).split())
    return bool(visible) and set(visible) == {"!"}


async def run_load(
    session: aiohttp.ClientSession,
    stack: Stack,
    chat: bool,
    rate: float,
    count: int,
    more: Callable[[int], bool] = lambda i: False,
) -> None:
    """``count`` requests at ``rate``/s, then more at the same pace while ``more(i)``
    (bounded by its caller), each bounded by CLIENT_TIMEOUT_S."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    i = 0
    while i < count or more(i):
        await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
        rid = f"{stack.method}-{stack.rid_prefix}{i}"
        tasks.append(asyncio.create_task(user_request(session, stack.url, rid, chat)))
        i += 1
    stack.requests = list(await asyncio.gather(*tasks))


# --------------------------------------------------------------------------- faults


async def inject(session: aiohttp.ClientSession, stacks: list[Stack], sc: Scenario) -> None:
    """The fault, into backend 0 of every stack at the same instant."""
    if sc.fault is None:
        for stack in stacks:
            stack.t_fault = time.time()
            stack.sims[0].kill()
        return

    async def one(stack: Stack) -> None:
        stack.t_fault = time.time()
        if sc.fault:
            await stack.sims[0].set_fault(session, sc.fault)

    await asyncio.gather(*(one(s) for s in stacks))


async def heal(session: aiohttp.ClientSession, stacks: list[Stack], sc: Scenario) -> None:
    if sc.fault is not None:

        async def one(stack: Stack) -> None:
            stack.t_heal = time.time()
            await stack.sims[0].set_fault(session, HEAL)

        await asyncio.gather(*(one(s) for s in stacks))
        return
    for stack in stacks:
        stack.sims[0].spawn()
    await asyncio.gather(*(_wait_listening(s) for s in stacks))


async def _wait_listening(stack: Stack) -> None:
    """Heal time of a restarted backend = when its port accepts connections."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", stack.sims[0].port)
        except OSError:
            await asyncio.sleep(0.02)
            continue
        stack.t_heal = time.time()
        writer.close()
        return
    raise TimeoutError(f"restarted backend {stack.faulty} not listening")


# --------------------------------------------------------------------------- analysis


@dataclass
class Routed:
    start: float
    host: str
    attempts: int


def read_access_log(path: Path) -> dict[str, Routed]:
    routed: dict[str, Routed] = {}
    if not path.exists():
        return routed
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            entry = json.loads(line)
            attempts = (
                int(entry.get("attempts") or 0) if str(entry.get("attempts")).isdigit() else 0
            )
            routed[str(entry["id"])] = Routed(float(entry["start"]), str(entry["host"]), attempts)
    return routed


def analyse(stack: Stack, sc: Scenario, end: float) -> dict[str, Any]:
    mine = f"{stack.method}-{stack.rid_prefix}"
    routed = {
        rid: r
        for rid, r in read_access_log(stack.access_log).items()
        if rid.startswith(mine) and (stack.rid_prefix or rid[len(mine) :].isdigit())
    }
    t0, t1 = stack.t_fault, stack.t_heal
    # A retried request (connect failure) first went to the one backend that fails.
    hit = {
        rid: r.start
        for rid, r in routed.items()
        if r.host == stack.faulty or (sc.fault is None and r.attempts > 1)
    }
    window = [r for r in stack.requests if t0 <= r.sent < t1]
    to_faulty = sorted(hit[r.rid] for r in window if r.rid in hit)
    removed_at, readmitted = removal(stack, t0, t1)
    isolated_at = isolation(to_faulty, t0, removed_at)
    # Every request of the run counts: those in flight at the fault instant can be hurt
    # too (a crash resets them); the lead phase before it is healthy.
    latencies = sorted(r.latency_s for r in window if r.latency_s is not None and r.outcome == "ok")
    out, full = envoy_timeline(stack, t0, t1)
    failed = sum(r.outcome == "failed" for r in stack.requests)
    stalled = sum(r.outcome == "stalled" for r in stack.requests)
    served = served_hurt(window, hit) if sc.served_hurts else 0
    return {
        "isolated": isolated_at is not None and sc.fault != {},
        "isolation_s": None if isolated_at is None else max(0.0, isolated_at - t0),
        "readmitted": readmitted,
        "share": len(to_faulty) / len(window) if window else math.nan,
        "failed": failed,
        "stalled": stalled,
        "served": served,
        "hurt": failed + stalled + served,
        "garbage_seen": sum(r.garbage for r in stack.requests),
        "healed_after_s": t1 - t0,
        "picker": None if stack.picker is None else stack.picker.sanity(),
        "hurt_before": sum(r.outcome != "ok" for r in stack.requests if r.sent < t0 - 1.0),
        "mean_ms": 1000 * statistics.fmean(latencies) if latencies else math.nan,
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))] if latencies else math.nan,
        "requests": len(stack.requests),
        "logged": len(routed),
        "envoy_out_s": None if out is None else out - t0,
        "heal_full_s": None if full is None else full - t1,
        "changes": view_changes(stack.views),
        "changes_faulty": view_changes(stack.views, only=stack.faulty),
        "own_changes": stack.own_changes,
        "als_counted": stack.als_counted,
        "series": _share_series(stack, hit, end),
    }


def served_hurt(window: list[Request], hit: dict[str, float]) -> int:
    """Requests of the fault window the faulty backend answered in time (``ok``) that are
    hurt all the same (``Scenario.served_hurts``); failed and stalled ones count apart."""
    return sum(1 for r in window if r.outcome == "ok" and r.rid in hit)


def removal(stack: Stack, t0: float, t1: float) -> tuple[float | None, bool]:
    """(when Envoy first took the faulty backend out of load balancing while it was
    faulty, whether Envoy put it back before the heal: outlier ejection time running out)."""
    out = None
    for at, view in stack.views:
        state = view.get(stack.faulty)
        if state is None or not t0 <= at < t1:
            continue
        if out is None and not state[0]:
            out = at
        elif out is not None and state[0]:
            return out, True
    return out, False


def isolation(routed: list[float], t0: float, removed_at: float | None) -> float | None:
    """When the last user request was routed to the faulty backend before Envoy took it
    out (``t0`` if none was); None if Envoy never took it out. Requests logged within one
    poll after the removal was seen still count (it happened between two polls)."""
    if removed_at is None:
        return None
    return max([t0, *(at for at in routed if at <= removed_at + POLL_S)])


def envoy_timeline(stack: Stack, t0: float, t1: float) -> tuple[float | None, float | None]:
    """When Envoy first took the faulty backend out of full traffic (routable at full
    weight) after the fault, and when it was back at full traffic after the heal."""
    before = [v[stack.faulty] for t, v in stack.views if t < t0 and stack.faulty in v]
    baseline = before[-1] if before else (True, 0)
    out = full = None
    for at, view in stack.views:
        state = view.get(stack.faulty)
        if at < t0 or state is None:
            continue
        if out is None and state != baseline:
            out = at
        if out is not None and at >= t1 and state == baseline:
            full = at
            break
    return out, full


def view_changes(
    views: list[tuple[float, dict[str, tuple[bool, int]]]], only: str | None = None
) -> int:
    """How often a backend's (routable, weight) in Envoy's view changed (``only``: one's)."""
    changes, last = 0, dict[str, tuple[bool, int]]()
    for _at, view in views:
        for address, state in view.items():
            if only is not None and address != only:
                continue
            if address in last and last[address] != state:
                changes += 1
            last[address] = state
    return changes


def _share_series(stack: Stack, hit: dict[str, float], end: float) -> list[tuple[float, float]]:
    """(seconds since fault, faulty share of requests sent in that 1-s bin)."""
    bins: dict[int, list[int]] = {}
    for r in stack.requests:
        slot = math.floor(r.sent - stack.t_fault)
        counts = bins.setdefault(slot, [0, 0])
        counts[0] += 1
        counts[1] += r.rid in hit
    return [
        (k + 0.5, v[1] / v[0])
        for k, v in sorted(bins.items())
        if v[0] >= 5 and k + 1 + stack.t_fault <= end
    ]


# --------------------------------------------------------------------------- one scenario


@dataclass
class Trial:
    """One fault cycle of a scenario: each stack's record of it, analysed once Envoy has
    stopped (its access log is only flushed then)."""

    phase_s: float  # fault injected this long after the lead time
    stacks: list[Stack]  # snapshots: requests, views, t_fault/t_heal of this trial only
    end: float


async def run_scenario(
    session: aiohttp.ClientSession,
    stacks: list[Stack],
    sc: Scenario,
    args: argparse.Namespace,
    phases: list[float] | None = None,
) -> list[dict[str, dict[str, Any]] | None]:
    """Start the stacks once, run one trial per phase (default: one, fault right after the
    lead time), stop the stacks, analyse. A trial that could not start from a healthy
    steady state is skipped: None in its place."""
    phases = [0.0] if phases is None else phases
    await asyncio.gather(*(s.sims[0].set_fault(session, HEAL) for s in stacks))
    trials: list[Trial | None] = []
    try:
        await asyncio.gather(*(s.start(sc) for s in stacks))
        await wait_all_routable(session, stacks)
        numbered = len(phases) > 1
        for k, phase in enumerate(phases):
            if numbered and not await restore(session, stacks):
                print(f"  trial {k + 1}: no healthy steady state, skipped", flush=True)
                trials.append(None)
                continue
            trial = await run_trial(session, stacks, sc, args, phase, k, numbered)
            trials.append(trial)
            if numbered:
                print(f"  trial {k + 1}/{len(phases)} done (phase {phase:.2f} s)", flush=True)
    finally:
        await asyncio.gather(*(s.stop() for s in stacks), return_exceptions=True)
    if len(phases) == 1 and trials[0] is not None:
        for snapshot, stack in zip(trials[0].stacks, stacks, strict=True):
            snapshot.own_changes = stack.transitions()  # the whole log, as ever
    return [
        None if t is None else {s.method: analyse(s, sc, t.end) for s in t.stacks} for t in trials
    ]


async def run_trial(
    session: aiohttp.ClientSession,
    stacks: list[Stack],
    sc: Scenario,
    args: argparse.Namespace,
    phase: float,
    index: int,
    numbered: bool,
) -> Trial:
    """``--lead`` s (+ ``phase``) of normal traffic, the fault, ``--fault-seconds``, the
    heal, ``--heal-seconds``; the load runs throughout."""
    changes_before = []
    for stack in stacks:
        stack.views, stack.requests = [], []
        stack.rid_prefix = f"t{index + 1}-" if numbered else ""
        changes_before.append((stack.transitions() or 0) if index > 0 else 0)
    stop = asyncio.Event()
    pollers = [asyncio.create_task(poll_views(session, s, stop)) for s in stacks]
    total_s = args.lead + phase + args.fault_seconds + args.heal_seconds
    count = int(total_s * args.rate)
    started = time.time()
    # A restarted backend (crash) listens only seconds after the heal instant (the process
    # starts: RESTART_NOTE); the heal phase then runs --heal-seconds from when it listens.
    until: list[float] = [started + total_s]

    rate: float = args.rate

    def more(i: int) -> bool:
        return started + i / rate < until[0]

    loads = [
        asyncio.create_task(run_load(session, s, sc.chat, args.rate, count, more)) for s in stacks
    ]
    await _at(started + args.lead + phase, inject(session, stacks, sc))
    await _at(stacks[0].t_fault + args.fault_seconds, heal(session, stacks, sc))
    if sc.fault is None:
        until[0] = max(until[0], max(s.t_heal for s in stacks) + args.heal_seconds)
    await asyncio.gather(*loads)
    await asyncio.gather(*(_als_counted(session, s) for s in stacks))
    end = time.time()
    stop.set()
    await asyncio.gather(*pollers)
    snapshots = []
    for stack, before in zip(stacks, changes_before, strict=True):
        total = stack.transitions()
        snapshots.append(
            dataclasses.replace(stack, own_changes=None if total is None else total - before)
        )
    return Trial(phase, snapshots, end)


async def restore(session: aiohttp.ClientSession, stacks: list[Stack]) -> bool:
    """Heal backend 0 of every stack (again; restart it if it is down), then wait until a
    healthy steady state: every backend routable at full weight in Envoy and, for
    llm-health, healthy in the plugin, for STEADY_HOLD_S in a row. Bounded: False if
    that did not happen within STEADY_TIMEOUT_S."""
    for stack in stacks:
        process = stack.sims[0].process
        if process is None or process.poll() is not None:
            stack.sims[0].spawn()
    await asyncio.gather(*(s.sims[0].up() for s in stacks))
    await asyncio.gather(*(s.sims[0].set_fault(session, HEAL) for s in stacks))
    deadline = time.monotonic() + STEADY_TIMEOUT_S
    steady_since: float | None = None
    while time.monotonic() < deadline:
        states = await asyncio.gather(*(_steady(session, s) for s in stacks))
        now = time.monotonic()
        if all(states):
            steady_since = now if steady_since is None else steady_since
            if now - steady_since >= STEADY_HOLD_S:
                return True
        else:
            steady_since = None
        await asyncio.sleep(POLL_S)
    return False


async def _steady(session: aiohttp.ClientSession, stack: Stack) -> bool:
    assert stack.envoy is not None
    try:
        url = f"http://{stack.envoy.admin_address}/clusters?format=json"
        async with session.get(url) as response:
            view = host_view(await response.json(content_type=None))
        if len(view) != BACKENDS or not all(r for r, _ in view.values()):
            return False
        if len({w for _, w in view.values()}) != 1:
            return False
        if stack.plugin is None:
            return True
        url = f"http://127.0.0.1:{stack.plugin.http_port}/status"
        async with session.get(url) as response:
            status = await response.json(content_type=None)
        states = [e["state"] for c in status["clusters"] for e in c["endpoints"]]
        return len(states) == BACKENDS and all(state == "healthy" for state in states)
    except (aiohttp.ClientError, ValueError, KeyError, TypeError, TimeoutError):
        return False


async def _als_counted(session: aiohttp.ClientSession, stack: Stack) -> None:
    """llm-health: how many user requests the plugin has counted from Envoy's access-log
    stream so far (passive health is live), from its /status; None if unreadable."""
    if stack.plugin is None:
        return
    url = f"http://127.0.0.1:{stack.plugin.http_port}/status"
    try:
        async with session.get(url) as response:
            document = await response.json(content_type=None)
        stack.als_counted = int(document["traffic"]["counted_total"])
    except (aiohttp.ClientError, ValueError, KeyError, TypeError, TimeoutError):
        stack.als_counted = None


async def _at(when: float, action: Awaitable[None]) -> None:
    await asyncio.sleep(max(0.0, when - time.time()))
    await action


# --------------------------------------------------------------------------- report


def _cell_isolation(r: dict[str, Any], sc: Scenario) -> str:
    if sc.fault == {}:
        return "—"
    if not r["isolated"]:
        return "not isolated"
    return f"{r['isolation_s']:.1f} s" + (", re-admitted" if r["readmitted"] else "")


def _cell_out(r: dict[str, Any], sc: Scenario) -> str:
    if sc.fault == {}:
        return "—"
    return "never" if r["envoy_out_s"] is None else f"{r['envoy_out_s']:.1f} s"


def _cell_heal(r: dict[str, Any], sc: Scenario) -> str:
    if sc.fault == {}:
        return "—"
    if r["envoy_out_s"] is None:
        return "never out"
    return "not back" if r["heal_full_s"] is None else f"{r['heal_full_s']:.1f} s"


def _cell_hurt(r: dict[str, Any], sc: Scenario) -> str:
    parts = f"{r['failed']} + {r['stalled']}"
    if sc.served_hurts:
        parts += f" + {r['served']} {sc.served_hurts}"
    return f"{r['hurt']} ({parts})"


TABLES: list[tuple[str, Callable[[dict[str, Any], Scenario], str]]] = [
    (
        "Time from fault to isolation (last user request routed to the faulty backend)",
        _cell_isolation,
    ),
    ("Time from fault to Envoy's first action on it (weight cut or removal)", _cell_out),
    (
        "User requests hurt (failed + stalled > 5 s; in garbage, wrong-model and saturated "
        "+ those the faulty backend served while faulty)",
        _cell_hurt,
    ),
    (
        "Faulty backend's share of the traffic while faulty (healthy: 33 %)",
        lambda r, sc: f"{100 * r['share']:.0f} %",
    ),
    ("Time from heal to full traffic again (Envoy's view)", _cell_heal),
    (
        "Latency of successful requests while faulty, mean / p95",
        lambda r, sc: f"{r['mean_ms']:.0f} / {r['p95_ms']:.0f} ms",
    ),
    (
        "State changes Envoy applied, all 3 backends (the faulty one)",
        lambda r, sc: f"{r['changes']} ({r['changes_faulty']})",
    ),
]


def render(
    results: dict[str, dict[str, dict[str, Any]]], scs: dict[str, Scenario], methods: list[str]
) -> str:
    parts = []
    for title, cell in TABLES:
        lines = [
            f"**{title}**",
            "",
            "| scenario | " + " | ".join(METHODS[m] for m in methods) + " |",
        ]
        lines.append("|---" * (len(methods) + 1) + "|")
        for name, per_method in results.items():
            cells = [cell(per_method[m], scs[name]) for m in methods]
            lines.append(f"| {scs[name].title} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def plot(
    results: dict[str, dict[str, dict[str, Any]]],
    scs: dict[str, Scenario],
    methods: list[str],
    path: Path,
    fault_s: float,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    cols = 3
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for method in methods:
            series = results[name][method]["series"]
            ax.plot([x for x, _ in series], [100 * y for _, y in series], label=METHODS[method])
        ax.axvline(0, color="red", linestyle=":")
        healed = [results[name][m]["healed_after_s"] for m in methods]
        ax.axvline(statistics.fmean(healed) if healed else fault_s, color="green", linestyle=":")
        ax.set_title(scs[name].title, fontsize=9)
        ax.set_ylim(-3, 103)
        ax.set_xlabel("s since fault (red) / heal (green)", fontsize=8)
        ax.set_ylabel("% of requests to backend 0", fontsize=8)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --------------------------------------------------------------------------- main


async def main_async(args: argparse.Namespace) -> int:
    all_scenarios = {s.name: s for s in scenarios(args.fault_seconds)}
    chosen = [all_scenarios[n] for n in args.scenarios]
    methods = list(args.methods)
    workroot = Path(tempfile.mkdtemp(prefix="bench-detection-"))
    base = free_port_block(BACKENDS * len(methods))
    stacks = [
        Stack(
            m,
            [
                Sim(base + i * BACKENDS + j, 1, (*SIM_ARGS, "--seed", str(j))).spawn()
                for j in range(BACKENDS)
            ],
            workroot / m,
        )
        for i, m in enumerate(methods)
    ]
    runs: dict[str, list[dict[str, dict[str, Any]] | None]] = {}
    phases: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    load_before = load_average()
    started = time.monotonic()
    try:
        await asyncio.gather(*(sim.up() for s in stacks for sim in s.sims))
        connector = aiohttp.TCPConnector(limit=400)
        async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
            for sc in chosen:
                t = time.monotonic()
                phases[sc.name] = fault_phases(args.seed, sc.name, args.trials)
                runs[sc.name] = await run_scenario(session, stacks, sc, args, phases[sc.name])
                seconds[sc.name] = time.monotonic() - t
                summary = "; ".join(
                    f"{m}: "
                    + ", ".join(
                        "skipped"
                        if r is None
                        else f"{_cell_isolation(r[m], sc)} hurt {r[m]['hurt']}"
                        for r in runs[sc.name]
                    )
                    for m in methods
                )
                print(f"[{seconds[sc.name]:4.0f} s] {sc.name}: {summary}", flush=True)
    finally:
        for stack in stacks:
            for sim in stack.sims:
                sim.stop()
        if not args.keep:
            shutil.rmtree(workroot, ignore_errors=True)
    scs = {s.name: s for s in chosen}
    elapsed = time.monotonic() - started
    command = "python bench/detection.py " + " ".join(sys.argv[1:])
    if args.trials > 1:
        table = render_trials(runs, scs, methods)
        print(table)
        body = (
            describe_trials(args, methods, load_before, elapsed, seconds)
            + "\n\n"
            + table
            + "\n\n"
            + per_trial(runs, phases, scs, methods)
        )
        path = write_result(args.output, body, command)
        print(f"written: {path}")
        return 0
    results = {name: trials[0] for name, trials in runs.items() if trials[0] is not None}
    table = render(results, scs, methods)
    print(table)
    png = RESULTS / "detection.png"
    RESULTS.mkdir(exist_ok=True)
    plot(results, scs, methods, png, args.fault_seconds)
    body = (
        describe(args, methods, load_before, elapsed)
        + "\n\n"
        + table
        + "\n\n"
        + checks(results, scs, methods)
    )
    write_result("detection", body + "\n\n![faulty backend share](detection.png)", command)
    return 0


def fault_phases(seed: int, scenario: str, trials: int) -> list[float]:
    """One fault phase per trial, uniform in [0, PROBE_INTERVAL_S): where the fault lands
    relative to the probers' schedule. Seeded per scenario, so a scenario gets the same
    phases whichever other scenarios run with it. A single trial keeps the fixed phase 0."""
    if trials <= 1:
        return [0.0]
    rng = random.Random(f"{seed}:{scenario}")
    return [rng.uniform(0.0, PROBE_INTERVAL_S) for _ in range(trials)]


# --------------------------------------------------------------------------- trials report


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default); ``q`` in [0, 1]."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def summarize(trials: list[dict[str, Any]], sc: Scenario) -> dict[str, Any]:
    """Over the trials of one scenario and method (skipped trials left out)."""
    faulty = sc.fault != {}
    isolated = [r["isolation_s"] for r in trials if r["isolated"]]
    acted = [r["envoy_out_s"] for r in trials if r["envoy_out_s"] is not None]
    hurt = [float(r["hurt"]) for r in trials]
    plugin = [r["own_changes"] for r in trials if r["own_changes"] is not None]
    return {
        "trials": len(trials),
        "faulty": faulty,
        "isolated": isolated,
        "never": len(trials) - len(isolated) if faulty else 0,
        "readmitted": sum(bool(r["readmitted"]) for r in trials),
        "acted": acted,
        "hurt": hurt,
        "changes": statistics.fmean(r["changes"] for r in trials),
        "changes_faulty": statistics.fmean(r["changes_faulty"] for r in trials),
        "plugin": statistics.fmean(plugin) if plugin else None,
        "hurt_before": sum(r["hurt_before"] for r in trials),
        "unlogged": sum(r["requests"] - r["logged"] for r in trials),
    }


def _seconds(values: list[float], q: float | None) -> str:
    if not values:
        return "—"
    return f"{(max(values) if q is None else percentile(values, q)):.2f} s"


def render_trials(
    runs: dict[str, list[dict[str, dict[str, Any]] | None]],
    scs: dict[str, Scenario],
    methods: list[str],
) -> str:
    lines = [
        "| scenario | method | trials | isolation p50 | p90 | max | never isolated "
        "| Envoy first action p50 | hurt p50 | hurt p90 | state changes / trial (faulty) "
        "| plugin / picker logged changes / trial |",
        "|---" * 12 + "|",
    ]
    for name, trials in runs.items():
        sc = scs[name]
        done = [t for t in trials if t is not None]
        for m in methods:
            if not done:
                lines.append(f"| {name} | {m} | 0 of {len(trials)} |" + " — |" * 9)
                continue
            r = summarize([t[m] for t in done], sc)
            count = f"{r['trials']}" + (f" of {len(trials)}" if len(done) < len(trials) else "")
            if r["faulty"]:
                iso = [_seconds(r["isolated"], 0.5), _seconds(r["isolated"], 0.9)]
                iso += [_seconds(r["isolated"], None)]
                never = f"{r['never']}" + (
                    f"; {r['readmitted']} re-admitted while faulty" if r["readmitted"] else ""
                )
                acted = _seconds(r["acted"], 0.5) if r["acted"] else "never"
                if r["acted"] and len(r["acted"]) < r["trials"]:
                    acted += f" ({r['trials'] - len(r['acted'])} never)"
            else:
                iso, never, acted = ["—", "—", "—"], "—", "—"
            plugin = "—" if r["plugin"] is None else f"{r['plugin']:.1f}"
            lines.append(
                f"| {name} | {METHODS[m]} | {count} | "
                + " | ".join(iso)
                + f" | {never} | {acted} | {percentile(r['hurt'], 0.5):g} "
                f"| {percentile(r['hurt'], 0.9):g} "
                f"| {r['changes']:.1f} ({r['changes_faulty']:.1f}) | {plugin} |"
            )
    return "\n".join(lines)


def per_trial(
    runs: dict[str, list[dict[str, dict[str, Any]] | None]],
    phases: dict[str, list[float]],
    scs: dict[str, Scenario],
    methods: list[str],
) -> str:
    """The raw numbers behind the table, trial by trial: phase (s after the lead time),
    isolation time ('-': never), requests hurt, Envoy state changes."""
    lines = [
        "Per trial (fault phase → isolation s / requests hurt / Envoy state changes; "
        "'-' never isolated; sanity: requests hurt more than 1 s before the fault and "
        "requests Envoy did not log, summed over the trials, should be 0):",
        "",
    ]
    for name, trials in runs.items():
        for m in methods:
            cells, before, unlogged = [], 0, 0
            for phase, t in zip(phases[name], trials, strict=True):
                if t is None:
                    cells.append(f"{phase:.2f}→skipped")
                    continue
                r = t[m]
                iso = "-" if not r["isolated"] else f"{r['isolation_s']:.2f}"
                if scs[name].fault == {}:
                    iso = "·"
                cells.append(f"{phase:.2f}→{iso}/{r['hurt']}/{r['changes']}")
                before += r["hurt_before"]
                unlogged += r["requests"] - r["logged"]
            lines.append(f"- {name} / {m}: " + ", ".join(cells) + f" (sanity {before}, {unlogged})")
    return "\n".join(lines)


def plugin_identity() -> str:
    """The git commit of the plugin code measured (this tree's), and the llm_health
    package the simulator/plugin subprocesses actually import."""

    def run(*command: str) -> str:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=20, cwd=ROOT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"? ({exc})"
        return done.stdout.strip() if done.returncode == 0 else f"? ({done.stderr.strip()})"

    commit = run("git", "-C", str(ROOT), "rev-parse", "HEAD")
    dirty = run("git", "-C", str(ROOT), "status", "--porcelain", "--", "plugin")
    state = ", with uncommitted changes under plugin/" if dirty else ""
    imported = subprocess.run(
        [sys.executable, "-c", "import llm_health; print(llm_health.__file__)"],
        capture_output=True,
        text=True,
        timeout=30,
        env=child_env(),
        cwd=ROOT,
    ).stdout.strip()
    return f"plugin commit `{commit}`{state} (tree {ROOT}); llm_health imported from {imported}"


def describe(args: argparse.Namespace, methods: list[str], load: str, elapsed: float) -> str:
    return (
        f"{len(methods)} stacks run concurrently ({', '.join(methods)}), each 3 simulator "
        f"backends (TTFT {BASE_TTFT}) + its own Envoy 1.40 (shipped sidecar-ads.yaml: "
        f"LEAST_REQUEST, panic threshold 0, merge window 0); method llm-health adds "
        f"`llm-health serve` with default probe settings except `probe.verify.every: "
        f"{VERIFY_EVERY}` (default 30 s: the garbage and wrong-model checks run that often, "
        f"and at 30 s a scenario would need at least ~66 s, see bench/detection.py), cluster "
        f"`model: sim-model`, and the shipped access-log stream from Envoy to the plugin "
        f"(passive health); the other methods' Envoys drop that stream (no plugin). Users: "
        f"{args.rate:g} req/s per stack, {USER_MAX_TOKENS}-token non-streamed completions "
        f"(streamed chat in the role-chunk scenario), client timeout {CLIENT_TIMEOUT_S:g} s, "
        f"'stalled' = no answer (first token) within {STALL_S:g} s. Per scenario: "
        f"{args.lead:g} s normal, {args.fault_seconds:g} s faulty, {args.heal_seconds:g} s "
        f"healed (the issue suggests 60 s per scenario; scaled down to fit `make bench`). "
        f"The fault hits backend 0 of every stack at the same instant.\n\n"
        f"Envoy checkers: interval 1 s, timeout 800 ms, unhealthy_threshold 2, "
        f"healthy_threshold 3 (llm-health's defaults). Outlier detection: "
        f"{json.dumps(OUTLIER)}, route timeout {OUTLIER_ROUTE_TIMEOUT} (real LLM routes "
        f"need minutes; 5 s is generous to it). Envoy's view of each backend (routable, "
        f"weight) is polled every {POLL_S * 1000:g} ms. Isolation: Envoy took the faulty "
        f"backend out of load balancing; the time given is that of the last user request "
        f"it routed there until then (access log). Without isolation a backend can still "
        f"get less traffic: LEAST_REQUEST avoids backends where requests pile up (share "
        f"table). 're-admitted': Envoy put it back while still faulty. {RESTART_NOTE}; "
        f"the faulty window (share, latency) lasts until then.\n\n"
        f"Metrics-only picker (an emulation of an endpoint picker judging by engine metrics "
        f"alone): a scraper in the benchmark reads each backend's /metrics every "
        f"{PICKER_SCRAPE_S * 1000:g} ms (timeout {PICKER_SCRAPE_TIMEOUT_S * 1000:g} ms); a "
        f"backend is out while vllm:num_requests_waiting >= {PICKER_QUEUE:g}, "
        f"vllm:kv_cache_usage_perc >= {PICKER_KV:g}, or no scrape succeeded for "
        f"{PICKER_STALE_S * 1000:g} ms. Envoy follows that verdict by an active HTTP check "
        f"of the scraper's judge (interval 100 ms, timeout 100 ms, thresholds 1 / 1), i.e. "
        f"within ~100-150 ms.\n\n"
        f"Hurt: failed (non-200, broken stream, connection error) or stalled (no answer, "
        f"first token, within {STALL_S:g} s). In garbage (fault garbage_tokens: fast 200s "
        f"whose tokens are all '!'), wrong-model (/v1/models lists another model; answers "
        f"look normal) and saturated (/metrics reports 12 waiting; service is NOT slowed) "
        f"the faulty backend answers on time, so there every request it served while "
        f"faulty (sent between fault and heal, routed there by Envoy's access log) is hurt "
        f"too: garbage output, the wrong model, a place in a queue of 12 on a real engine "
        f"(notional: the simulator does not slow down; read it as traffic sent to a "
        f"saturated engine).\n\n"
        f"Measured: {plugin_identity()}.\n\n"
        f"Load average before the run: {load}; after: {load_average()}. Wall time: "
        f"{elapsed:.0f} s."
    )


def describe_trials(
    args: argparse.Namespace,
    methods: list[str],
    load: str,
    elapsed: float,
    seconds: dict[str, float],
) -> str:
    took = ", ".join(f"{name} {t:.0f} s" for name, t in seconds.items())
    return (
        f"{args.trials} trials per scenario, methods {', '.join(methods)} (one stack each, "
        f"run concurrently: 3 simulator backends, TTFT {BASE_TTFT}, + its own Envoy 1.40 "
        f"from the shipped sidecar-ads.yaml; llm-health with default probe settings but "
        f"verify.every {VERIFY_EVERY}; the other methods as in detection.md). Users: "
        f"{args.rate:g} req/s per stack, 'hurt' = failed or no answer (first token) within "
        f"{STALL_S:g} s, plus, in garbage / wrong-model / saturated, every request the faulty "
        f"backend served while faulty.\n\n"
        f"Each trial: {args.lead:g} s normal + a random fault phase, {args.fault_seconds:g} s "
        f"faulty, {args.heal_seconds:g} s healed. The fault phase is uniform in "
        f"[0, {PROBE_INTERVAL_S:g} s) (the probe interval), from random.Random(seed "
        f"{args.seed}, scenario name), so the fault lands anywhere relative to the probers' "
        f"schedule and a rerun with the same seed gets the same phases. The stacks of a "
        f"scenario are started once and reused by its trials; before every trial, "
        f"backend 0 is healed again (restarted if down) and the trial waits "
        f"until every backend is routable at full weight in Envoy and healthy in the plugin "
        f"for {STEADY_HOLD_S:g} s in a row (at most {STEADY_TIMEOUT_S:g} s, else the trial is "
        f"skipped and counted as such).\n\n"
        f"Isolation: Envoy took the faulty backend out of load balancing; the time is that "
        f"of the last user request it routed there until then (access log), from the fault. "
        f"p50 / p90 / max are over the trials that isolated it (linear interpolation); "
        f"'never isolated' counts the others. 'Envoy first action': weight cut or removal. "
        f"Hurt p50 / p90 over all trials. State changes: of Envoy's view (routable, "
        f"weight) of all 3 backends, polled every {POLL_S * 1000:g} ms, mean per trial (the "
        f"faulty backend's in brackets); logged: 'state change' records of "
        f"llm-health, or verdict changes of the metrics-only picker, during the trial.\n\n"
        f"Measured: {plugin_identity()}.\n\n"
        f"Load average before the run: {load}; after: {load_average()}. Wall time: "
        f"{elapsed:.0f} s ({took})."
    )


def checks(
    results: dict[str, dict[str, dict[str, Any]]], scs: dict[str, Scenario], methods: list[str]
) -> str:
    lines = [
        "Sanity: requests sent / logged by Envoy, hurt more than 1 s before the fault, "
        "state changes the plugin logged (llm-health) / the metrics-only picker's scrapes, "
        "verdict changes and the largest gap between two checks Envoy sent its judge; in "
        "garbage, the all-'!' answers users saw (should equal the served-while-faulty "
        "count, give or take a request at the fault and heal instants):"
    ]
    for name, per_method in results.items():
        cells = []
        for m in methods:
            r = per_method[m]
            extra = ""
            if r["picker"] is not None:
                extra = f", {r['picker']}"
            elif r["own_changes"] is not None:
                extra = f", {r['own_changes']} logged"
            if r["als_counted"] is not None:
                extra += f", {r['als_counted']} requests counted from the access-log stream"
            if scs[name].name == "garbage":
                extra += f", {r['garbage_seen']} garbage answers seen"
            if scs[name].fault is None:
                extra += f", restarted backend listening {r['healed_after_s']:.1f} s after the kill"
            cells.append(f"{m} {r['requests']}/{r['logged']}, {r['hurt_before']}{extra}")
        lines.append(f"- {name}: " + "; ".join(cells))
    return "\n".join(lines)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [s.name for s in scenarios(12)]
    parser.add_argument("--scenarios", nargs="+", default=names, choices=names)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--rate", type=float, default=20.0, help="user requests/s per stack")
    parser.add_argument("--lead", type=float, default=3.0, help="seconds before the fault")
    parser.add_argument("--fault-seconds", type=float, default=12.0)
    parser.add_argument("--heal-seconds", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep Envoy/plugin logs in /tmp")
    parser.add_argument(
        "--trials",
        type=positive_int,
        default=1,
        help="fault cycles per scenario, each at a random fault phase within one probe "
        "interval (stacks reused); >1 writes results/detection_trials.md instead",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault phases")
    parser.add_argument(
        "--output",
        default="detection_trials",
        help="results file name (without .md) of a --trials run",
    )
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
