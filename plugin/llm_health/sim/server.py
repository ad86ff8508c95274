"""The simulator's HTTP server: an OpenAI-compatible fake inference engine with faults.

It speaks the vLLM flavour of the OpenAI API (``/v1/completions``,
``/v1/chat/completions``, ``/v1/models``, ``/health``, ``/metrics``) and adds a control
plane under ``/sim/`` to change the injected fault at run time and to read counters.
See ``docs/simulator.md`` for the user-facing contract.

Contracts kept by this module:

- One :class:`SimState` per application; every port served by :func:`serve` shares it.
  There is no module-level mutable state.
- Every inference request ends in exactly one of ``completed``, ``failed`` or
  ``aborted`` (client went away before the response was fully sent), so
  ``requests == completed + failed + aborted + in_flight`` (until a stats reset).
- Every wait (TTFT, inter-token, hang) ends early when the client disconnects or the
  application shuts down, and every hang is bounded by ``FaultSpec.hang_max``: no
  handler outlives its client or blocks server shutdown.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from aiohttp import web

from llm_health.sim.faults import FaultSpec

__all__ = [
    "CUDA_ERROR_MESSAGE",
    "STATE_KEY",
    "SimCounters",
    "SimHandle",
    "SimSettings",
    "SimState",
    "build_app",
    "render_metrics",
    "running_sim",
    "serve",
]

Kind = Literal["completions", "chat"]
Outcome = Literal["completed", "failed", "aborted"]

#: How often a long wait re-checks that its client is still connected, for apps run
#: without ``handler_cancellation`` (ours cancel the handler on disconnect at once).
_DISCONNECT_POLL_S = 0.5
#: Grace given to handlers at shutdown before aiohttp cancels them.
_SHUTDOWN_TIMEOUT_S = 1.0
#: Longest string kept per field of a request in ``recent`` (bounds memory).
_MAX_RECORDED_CHARS = 2000
_MAX_RECORDED_MESSAGES = 20
_DEFAULT_MAX_TOKENS = 16

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_JSON_CONTENT_TYPE = "application/json"
_METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_DONE_EVENT = b"data: [DONE]\n\n"

CUDA_ERROR_MESSAGE = (
    "EngineCore encountered an issue. See stack trace (above) for the root cause. "
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, "
    "so the stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
_GARBAGE_LINES = (
    b"data: \x00\x01\x02\xff\xfe\xfd garbage \x7f\x80\x81\n\n",
    b"data: {this is not json\n\n",
    b"<html><body><h1>502 Bad Gateway</h1></body></html>\n",
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\n\n",
    b"data: }}}{{{ ,,, \n\n",
)


@dataclass(frozen=True)
class SimSettings:
    """Fixed settings of one simulator application.

    - ``model``: the only model name served (``/v1/models``, responses, metric labels).
    - ``fault``: the fault spec in force when the server starts.
    - ``seed``: seed of the RNG behind ``ttft_jitter`` and ``fault_rate`` (None: random).
    - ``max_num_seqs``: capacity used to derive ``vllm:kv_cache_usage_perc``.
    - ``accept_any_model``: if False, a request naming another model gets 404 (as vLLM).
    - ``api_key``: if set, ``/v1/*`` requires ``Authorization: Bearer <api_key>`` (401).
    - ``recent_size``: how many recent inference requests ``/sim/stats`` keeps.
    """

    model: str = "sim-model"
    fault: FaultSpec = field(default_factory=FaultSpec)
    seed: int | None = None
    max_num_seqs: int = 256
    accept_any_model: bool = False
    api_key: str | None = None
    recent_size: int = 100

    def __post_init__(self) -> None:
        """Reject settings no simulator can run with (ValueError naming the field)."""
        if not self.model:
            raise ValueError("model: must not be empty")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be at least 1, got {self.max_num_seqs}")
        if self.recent_size < 0:
            raise ValueError(f"recent_size: must not be negative, got {self.recent_size}")


@dataclass
class SimCounters:
    """Counters shown by ``/sim/stats``; all zeroed by ``POST /sim/stats/reset``."""

    requests: int = 0
    probe_requests: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    faulted: int = 0
    bad_requests: int = 0
    unauthorized: int = 0


class SimState:
    """Mutable state of one simulator: current fault, counters, in-flight gauges.

    Single-threaded by design (the asyncio loop); shared by every port of the app.
    """

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.fault = settings.fault
        self.fault_set_at = time.monotonic()
        self.started_at = time.monotonic()
        self.rng = random.Random(settings.seed)
        self.counters = SimCounters()
        self.paths: Counter[str] = Counter()
        self.recent: deque[dict[str, Any]] = deque(maxlen=settings.recent_size)
        self.in_flight = 0
        self.running = 0
        self.stopping = False
        self._stop_signal: asyncio.Future[None] | None = None

    @property
    def waiting(self) -> int:
        """In-flight inference requests that have not produced a token yet."""
        return self.in_flight - self.running

    @property
    def last_request(self) -> dict[str, Any] | None:
        """The record of the most recent inference request, or None."""
        return self.recent[-1] if self.recent else None

    def set_fault(self, spec: FaultSpec) -> None:
        """Make ``spec`` the current fault; restarts the ``startup_delay`` clock."""
        self.fault = spec
        self.fault_set_at = time.monotonic()

    def choose_fault(self, spec: FaultSpec) -> str:
        """Return the fault to apply to one new request under ``spec`` ("none" if spared).

        ``fault_rate`` decides with the seeded RNG; ``startup_delay`` is spared once its
        delay since :meth:`set_fault` has passed.
        """
        if spec.fault == "none":
            return "none"
        if spec.fault_rate < 1.0 and self.rng.random() >= spec.fault_rate:
            return "none"
        if spec.fault == "startup_delay" and self.startup_elapsed(spec):
            return "none"
        return spec.fault

    def startup_elapsed(self, spec: FaultSpec) -> bool:
        """True once ``spec.startup_delay`` has passed since the fault was set."""
        return time.monotonic() - self.fault_set_at >= spec.startup_delay

    def reset_stats(self) -> None:
        """Zero counters, path counts and the recent-request log (gauges stay)."""
        self.counters = SimCounters()
        self.paths.clear()
        self.recent.clear()

    def stop_signal(self) -> asyncio.Future[None]:
        """A future of the running loop, resolved when the application shuts down."""
        if self._stop_signal is None:
            self._stop_signal = asyncio.get_running_loop().create_future()
            if self.stopping:
                self._stop_signal.set_result(None)
        return self._stop_signal

    def begin_shutdown(self) -> None:
        """Release every pending wait: called from the application's on_shutdown."""
        self.stopping = True
        if self._stop_signal is not None and not self._stop_signal.done():
            self._stop_signal.set_result(None)

    def stats(self) -> dict[str, Any]:
        """The JSON document served by ``GET /sim/stats``."""
        return {
            **asdict(self.counters),
            "in_flight": self.in_flight,
            "waiting": self.waiting,
            "running": self.running,
            "paths": dict(self.paths),
            "fault": self.fault.to_json(),
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "last_request": self.last_request,
            "recent": list(self.recent),
        }


STATE_KEY = web.AppKey("llm_health_sim_state", SimState)


@dataclass(frozen=True)
class SimHandle:
    """A running simulator: where it listens and its shared state."""

    host: str
    ports: tuple[int, ...]
    state: SimState
    app: web.Application

    @property
    def port(self) -> int:
        """The first (usually only) port."""
        return self.ports[0]

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the first port."""
        return _base_url(self.host, self.port)

    @property
    def base_urls(self) -> list[str]:
        """``http://host:port`` of every port, in order."""
        return [_base_url(self.host, port) for port in self.ports]


class _BadRequest(Exception):
    """A request the simulator refuses; carries the HTTP status and OpenAI error type."""

    def __init__(self, message: str, status: int = 400, error_type: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.error_type = error_type


class _ClientGone(Exception):
    """The client closed the connection while the handler was waiting."""


class _Stopping(Exception):
    """The application is shutting down; the handler must end now."""


@dataclass(frozen=True)
class _Params:
    """The parts of an inference request body the simulator uses."""

    model: str
    stream: bool
    max_tokens: int
    include_usage: bool
    prompt: object
    messages: object
    cache_salt: str | None


@dataclass
class _Call:
    """One inference request being served."""

    request: web.Request
    state: SimState
    kind: Kind
    params: _Params
    spec: FaultSpec
    fault: str
    call_id: str
    created: int = field(default_factory=lambda: int(time.time()))
    response: web.StreamResponse | None = None
    outcome: Outcome = "failed"
    is_running: bool = False

    def mark_running(self) -> None:
        """Move from 'waiting' to 'running' in the metrics (first token produced)."""
        if not self.is_running:
            self.is_running = True
            self.state.running += 1


# ---------------------------------------------------------------------------- app


def build_app(settings: SimSettings) -> web.Application:
    """Return the simulator application with a fresh :class:`SimState` under STATE_KEY.

    Run it with ``handler_cancellation=True`` (as :func:`serve` does) for immediate
    disconnect detection; without it disconnects are still seen within 0.5 s.
    """
    app = web.Application(middlewares=[_count_paths])
    state = SimState(settings)
    app[STATE_KEY] = state
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/sim/fault", _get_fault)
    app.router.add_post("/sim/fault", _set_fault)
    app.router.add_get("/sim/stats", _get_stats)
    app.router.add_post("/sim/stats/reset", _reset_stats)
    app.on_shutdown.append(_on_shutdown)
    return app


async def _on_shutdown(app: web.Application) -> None:
    """Release hangs and waits so shutdown never waits on a simulated fault."""
    app[STATE_KEY].begin_shutdown()


@web.middleware
async def _count_paths(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Count every request by route path (unknown paths share the key "other")."""
    resource = request.match_info.route.resource
    key = resource.canonical if resource is not None else "other"
    request.app[STATE_KEY].paths[key] += 1
    return await handler(request)


# ------------------------------------------------------------ simple endpoints


async def _health(request: web.Request) -> web.Response:
    """200 with an empty body whatever the fault (as a zombie engine does), unless the
    separate ``health`` knob says otherwise: "http_503", or "reset" (abort, no answer)."""
    mode = request.app[STATE_KEY].fault.health
    if mode == "reset" and request.transport is not None:
        request.transport.abort()
    return web.Response(status=503 if mode == "http_503" else 200)


async def _models(request: web.Request) -> web.Response:
    """The OpenAI model list, with the one served model."""
    settings = request.app[STATE_KEY].settings
    model = {
        "id": settings.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": settings.model,
        "parent": None,
        "permission": [],
    }
    return web.json_response({"object": "list", "data": [model]})


async def _metrics(request: web.Request) -> web.Response:
    """Prometheus text with vLLM's gauge names reflecting in-flight requests."""
    state = request.app[STATE_KEY]
    return web.Response(
        body=render_metrics(state).encode(), headers={"Content-Type": _METRICS_CONTENT_TYPE}
    )


def render_metrics(state: SimState) -> str:
    """Render ``state`` as Prometheus text exposition (vLLM names, plus sim counters)."""
    label = f'model_name="{_escape_label(state.settings.model)}"'
    kv_usage = min(1.0, state.in_flight / max(1, state.settings.max_num_seqs))
    counters = state.counters
    series: list[tuple[str, str, str, float]] = [
        ("vllm:num_requests_running", "gauge", "Requests producing tokens.", state.running),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Requests waiting for a first token.",
            state.waiting,
        ),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent.", kv_usage),
        ("llm_health_sim_requests_total", "counter", "Inference requests.", counters.requests),
        (
            "llm_health_sim_probe_requests_total",
            "counter",
            "Probe requests.",
            counters.probe_requests,
        ),
        ("llm_health_sim_completed_total", "counter", "Completed requests.", counters.completed),
        ("llm_health_sim_failed_total", "counter", "Failed requests.", counters.failed),
        (
            "llm_health_sim_aborted_total",
            "counter",
            "Requests aborted by the client.",
            counters.aborted,
        ),
    ]
    lines: list[str] = []
    for name, kind, help_text, value in series:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines.append(f"{name}{{{label}}} {float(value)!r}")
    return "\n".join(lines) + "\n"


def _escape_label(value: str) -> str:
    """Escape a Prometheus label value (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# ------------------------------------------------------------- control plane


async def _get_fault(request: web.Request) -> web.Response:
    """The current fault spec as JSON."""
    return web.json_response(request.app[STATE_KEY].fault.to_json())


async def _set_fault(request: web.Request) -> web.Response:
    """Merge the posted JSON onto the current spec and make it current.

    Keys left out keep their current value. Bad input: 400, state unchanged.
    """
    state = request.app[STATE_KEY]
    try:
        data = await _read_json(request)
        spec = FaultSpec.from_json(data, base=state.fault)
    except ValueError as exc:
        return _error_response(400, f"invalid fault spec: {exc}", "BadRequestError")
    state.set_fault(spec)
    return web.json_response(spec.to_json())


async def _get_stats(request: web.Request) -> web.Response:
    """Counters, gauges, the current fault and recent requests as JSON."""
    return web.json_response(request.app[STATE_KEY].stats())


async def _reset_stats(request: web.Request) -> web.Response:
    """Zero the counters; answers the fresh stats."""
    state = request.app[STATE_KEY]
    state.reset_stats()
    return web.json_response(state.stats())


# ------------------------------------------------------------ inference


async def _completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    return await _serve_inference(request, "completions")


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    return await _serve_inference(request, "chat")


async def _serve_inference(request: web.Request, kind: Kind) -> web.StreamResponse:
    """Validate, account, then serve one inference request under the current fault."""
    state = request.app[STATE_KEY]
    try:
        _check_auth(request, state.settings)
        params = _parse_params(await _read_json(request), kind, state.settings)
    except _BadRequest as exc:
        if exc.status == 401:
            state.counters.unauthorized += 1
            return web.json_response({"error": "Unauthorized"}, status=401)
        state.counters.bad_requests += 1
        return _error_response(exc.status, str(exc), exc.error_type)
    except ValueError as exc:
        state.counters.bad_requests += 1
        return _error_response(400, str(exc), "BadRequestError")
    call = _begin_call(request, state, kind, params)
    try:
        return await _FAULT_HANDLERS[call.fault](call)
    except (_ClientGone, ConnectionError):
        call.outcome = "aborted"
        return call.response or web.Response(status=499)
    except asyncio.CancelledError:
        call.outcome = "aborted"
        raise
    except _Stopping:
        call.outcome = "failed"
        if call.response is not None:
            return call.response
        return _error_response(503, "simulator shutting down", "ServiceUnavailableError")
    finally:
        _end_call(call)


def _begin_call(request: web.Request, state: SimState, kind: Kind, params: _Params) -> _Call:
    """Create the call, pick its fault, and count it (requests, probes, recent, in-flight)."""
    spec = state.fault
    fault = state.choose_fault(spec)
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    call = _Call(request, state, kind, params, spec, fault, prefix + uuid.uuid4().hex)
    probe_header = request.headers.get("X-LLM-Probe")
    is_probe = probe_header is not None and probe_header.strip().lower() == "true"
    counters = state.counters
    counters.requests += 1
    counters.probe_requests += is_probe
    counters.faulted += fault != "none"
    state.in_flight += 1
    state.recent.append(_record(request, params, fault, probe_header, is_probe))
    return call


def _end_call(call: _Call) -> None:
    """Count the call's outcome and release its in-flight slot (exactly once)."""
    state = call.state
    state.in_flight -= 1
    if call.is_running:
        state.running -= 1
    counters = state.counters
    if call.outcome == "completed":
        counters.completed += 1
    elif call.outcome == "aborted":
        counters.aborted += 1
    else:
        counters.failed += 1


def _record(
    request: web.Request, params: _Params, fault: str, probe_header: str | None, is_probe: bool
) -> dict[str, Any]:
    """The entry kept in ``recent`` for one inference request (strings clipped)."""
    return {
        "time": time.time(),
        "path": request.path,
        "probe": is_probe,
        "probe_header": probe_header,
        "authorization": "Authorization" in request.headers,
        "model": params.model,
        "stream": params.stream,
        "max_tokens": params.max_tokens,
        "prompt": _clip(params.prompt),
        "messages": _clip(params.messages),
        "cache_salt": params.cache_salt,
        "fault": fault,
    }


def _clip(value: object, depth: int = 0) -> object:
    """Copy a JSON value with long strings and lists cut short (bounded memory)."""
    if isinstance(value, str):
        return value[:_MAX_RECORDED_CHARS]
    if depth > 4:
        return None
    if isinstance(value, list):
        return [_clip(item, depth + 1) for item in value[:_MAX_RECORDED_MESSAGES]]
    if isinstance(value, dict):
        items = list(value.items())[:_MAX_RECORDED_MESSAGES]
        return {str(k): _clip(v, depth + 1) for k, v in items}
    return value


def _check_auth(request: web.Request, settings: SimSettings) -> None:
    """Raise a 401 _BadRequest if an API key is configured and not presented."""
    if settings.api_key is None:
        return
    if request.headers.get("Authorization") != f"Bearer {settings.api_key}":
        raise _BadRequest("Unauthorized", status=401)


async def _read_json(request: web.Request) -> object:
    """Decode the request body as JSON; raise ValueError with the reason otherwise."""
    raw = await request.read()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"request body is not valid JSON: {exc}") from exc


def _parse_params(body: object, kind: Kind, settings: SimSettings) -> _Params:
    """Validate an inference body the way vLLM would; raise _BadRequest naming the field."""
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    model = body.get("model", settings.model)
    if not isinstance(model, str):
        raise _BadRequest('"model" must be a string')
    if model != settings.model and not settings.accept_any_model:
        raise _BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _BadRequest('"stream" must be a boolean')
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = _DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _BadRequest(f'"max_tokens" must be a positive integer, got {max_tokens!r}')
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise _BadRequest('"cache_salt" must be a string')
    prompt, messages = _parse_input(body, kind)
    return _Params(
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        include_usage=_include_usage(body),
        prompt=prompt,
        messages=messages,
        cache_salt=cache_salt,
    )


def _parse_input(body: Mapping[str, object], kind: Kind) -> tuple[object, object]:
    """Return ``(prompt, messages)``; the one the endpoint needs must be present."""
    if kind == "completions":
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or not prompt:
            raise _BadRequest('"prompt" is required: a non-empty string or list')
        return prompt, None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest('"messages" is required: a non-empty list')
    if not all(isinstance(message, dict) for message in messages):
        raise _BadRequest('"messages" must be a list of objects')
    return None, messages


def _include_usage(body: Mapping[str, object]) -> bool:
    """True if ``stream_options.include_usage`` asks for a final usage chunk."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


# ------------------------------------------------------------ waiting


def _client_gone(request: web.Request) -> bool:
    """True once the client's connection is closed or closing."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def _pause(call: _Call, seconds: float) -> None:
    """Wait ``seconds``; raise _ClientGone if the client leaves, _Stopping at shutdown."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    stop = call.state.stop_signal()
    while True:
        if call.state.stopping:
            raise _Stopping
        if _client_gone(call.request):
            raise _ClientGone
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        await asyncio.wait((stop,), timeout=min(remaining, _DISCONNECT_POLL_S))


# ------------------------------------------------------------ response bodies


def _error_body(message: str, error_type: str, code: int) -> dict[str, object]:
    """An OpenAI-style error document."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def _error_response(
    status: int, message: str, error_type: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An OpenAI-style JSON error response."""
    return web.json_response(
        _error_body(message, error_type, status), status=status, headers=headers
    )


def _token_text(index: int) -> str:
    """The text of generated token ``index``: "tok0", " tok1", " tok2", …"""
    return f"tok{index}" if index == 0 else f" tok{index}"


def _chunk(call: _Call, choice: dict[str, object]) -> dict[str, object]:
    """A streamed chunk envelope around one choice, as vLLM emits it."""
    obj = "chat.completion.chunk" if call.kind == "chat" else "text_completion"
    return {
        "id": call.call_id,
        "object": obj,
        "created": call.created,
        "model": call.params.model,
        "choices": [choice],
    }


def _role_chunk(call: _Call) -> dict[str, object]:
    """The first chat chunk: assistant role, empty content, no token."""
    delta = {"role": "assistant", "content": ""}
    return _chunk(call, {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})


def _token_chunk(call: _Call, index: int, finish_reason: str | None) -> dict[str, object]:
    """The chunk carrying token ``index`` (and the finish reason on the last one)."""
    text = _token_text(index)
    if call.kind == "chat":
        choice: dict[str, object] = {"index": 0, "delta": {"content": text}}
    else:
        choice = {"index": 0, "text": text}
    choice.update({"logprobs": None, "finish_reason": finish_reason, "stop_reason": None})
    return _chunk(call, choice)


def _usage(call: _Call) -> dict[str, int]:
    """Token usage: prompt tokens approximated by whitespace words."""
    source = call.params.prompt if call.kind == "completions" else call.params.messages
    prompt_tokens = max(1, _count_words(source))
    completion = call.params.max_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion,
        "completion_tokens": completion,
    }


def _count_words(value: object) -> int:
    """Whitespace words in every string of a JSON value; token ids count one each."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(1 if isinstance(item, int) else _count_words(item) for item in value)
    if isinstance(value, dict):
        return _count_words(value.get("content"))
    return 0


def _usage_chunk(call: _Call) -> dict[str, object]:
    """The final ``stream_options.include_usage`` chunk: no choices, usage filled."""
    chunk = _chunk(call, {})
    chunk["choices"] = []
    chunk["usage"] = _usage(call)
    return chunk


def _full_body(call: _Call) -> dict[str, object]:
    """A non-streamed completion with every token."""
    text = "".join(_token_text(i) for i in range(call.params.max_tokens))
    finish: dict[str, object] = {"logprobs": None, "finish_reason": "length", "stop_reason": None}
    if call.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, **finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, **finish}
        obj = "text_completion"
    return {
        "id": call.call_id,
        "object": obj,
        "created": call.created,
        "model": call.params.model,
        "choices": [choice],
        "usage": _usage(call),
    }


# ------------------------------------------------------------ writing


async def _open(call: _Call) -> web.StreamResponse:
    """Send 200 headers now (SSE for streams, JSON otherwise) and keep the response."""
    headers = _SSE_HEADERS if call.params.stream else {"Content-Type": _JSON_CONTENT_TYPE}
    response = web.StreamResponse(status=200, headers=headers)
    call.response = response
    await response.prepare(call.request)
    return response


async def _send_event(response: web.StreamResponse, payload: Mapping[str, object]) -> None:
    """Write one SSE ``data:`` event; raises ConnectionError if the client is gone."""
    await response.write(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")


async def _send_whole(call: _Call, response: web.StreamResponse) -> web.StreamResponse:
    """Send a complete (non-streamed) response inside the handler, so failures are seen."""
    call.response = response
    await response.prepare(call.request)
    await response.write_eof()
    return response


# ------------------------------------------------------------ fault handlers


async def _fault_none(call: _Call) -> web.StreamResponse:
    """Normal service: TTFT wait, then tokens every tpot."""
    return await _generate(call, call.spec.draw_ttft(call.state.rng))


async def _fault_slow_under_load(call: _Call) -> web.StreamResponse:
    """Normal service whose TTFT grows with the other requests in flight."""
    others = max(0, call.state.in_flight - 1)
    extra = call.spec.load_ttft_per_request * others
    return await _generate(call, call.spec.draw_ttft(call.state.rng) + extra)


async def _generate(call: _Call, ttft: float) -> web.StreamResponse:
    """Serve ``max_tokens`` tokens, streamed or as one JSON; sets outcome 'completed'."""
    if not call.params.stream:
        await _pause(call, ttft)
        call.mark_running()
        await _pause(call, call.spec.tpot * (call.params.max_tokens - 1))
        whole = await _send_whole(call, web.json_response(_full_body(call)))
        call.outcome = "completed"
        return whole
    response = await _open(call)
    if call.kind == "chat":
        await _send_event(response, _role_chunk(call))
    await _pause(call, ttft)
    call.mark_running()
    last = call.params.max_tokens - 1
    for index in range(call.params.max_tokens):
        await _send_event(response, _token_chunk(call, index, "length" if index == last else None))
        # Also after the last token: a client closing right after it is still seen.
        await _pause(call, call.spec.tpot)
    if call.params.include_usage:
        await _send_event(response, _usage_chunk(call))
    await response.write(_DONE_EVENT)
    await response.write_eof()
    call.outcome = "completed"
    return response


async def _hang(call: _Call) -> None:
    """Wait up to ``hang_max``, ending early on disconnect or shutdown (by raising)."""
    await _pause(call, call.spec.hang_max)


async def _fault_hang_before_headers(call: _Call) -> web.StreamResponse:
    """Never answer; after ``hang_max`` give up with a 504."""
    await _hang(call)
    message = "simulated hang ended after hang_max"
    return await _send_whole(call, _error_response(504, message, "GatewayTimeoutError"))


async def _fault_hang_after_headers(call: _Call) -> web.StreamResponse:
    """Send 200 headers, then nothing; after ``hang_max`` end the empty body."""
    response = await _open(call)
    await _hang(call)
    await response.write_eof()
    return response


async def _fault_hang_after_role_chunk(call: _Call) -> web.StreamResponse:
    """Chat streams: flush the role delta, then nothing. Others: hang after headers."""
    if not (call.params.stream and call.kind == "chat"):
        return await _fault_hang_after_headers(call)
    response = await _open(call)
    await _send_event(response, _role_chunk(call))
    await _hang(call)
    await response.write_eof()
    return response


async def _fault_http_500(call: _Call) -> web.StreamResponse:
    """A generic 500."""
    return await _send_whole(
        call, _error_response(500, "Internal Server Error", "InternalServerError")
    )


async def _fault_cuda_error(call: _Call) -> web.StreamResponse:
    """A 500 whose body carries vLLM's CUDA illegal-memory-access / EngineDeadError text."""
    return await _send_whole(call, _error_response(500, CUDA_ERROR_MESSAGE, "InternalServerError"))


async def _fault_error_mid_stream(call: _Call) -> web.StreamResponse:
    """200 SSE, then after the TTFT wait an error event (CUDA error), then [DONE]."""
    if not call.params.stream:
        await _pause(call, call.spec.draw_ttft(call.state.rng))
        return await _fault_cuda_error(call)
    response = await _open(call)
    if call.kind == "chat":
        await _send_event(response, _role_chunk(call))
    await _pause(call, call.spec.draw_ttft(call.state.rng))
    await _send_event(response, _error_body(CUDA_ERROR_MESSAGE, "InternalServerError", 500))
    await response.write(_DONE_EVENT)
    await response.write_eof()
    return response


async def _fault_overloaded(call: _Call) -> web.StreamResponse:
    """429 (rate limited) or 503 (overloaded) per ``overload_status``, with Retry-After."""
    if call.spec.overload_status == 429:
        message, error_type = "Too many requests, please try again later", "RateLimitError"
    else:
        message = "Server overloaded: too many pending requests"
        error_type = "ServiceUnavailableError"
    response = _error_response(
        call.spec.overload_status, message, error_type, headers={"Retry-After": "1"}
    )
    return await _send_whole(call, response)


async def _fault_garbage_stream(call: _Call) -> web.StreamResponse:
    """200, then after the TTFT wait lines of non-JSON junk, no token, then the end."""
    response = await _open(call)
    await _pause(call, call.spec.draw_ttft(call.state.rng))
    for line in _GARBAGE_LINES:
        await response.write(line)
    await response.write_eof()
    return response


async def _fault_close_after_headers(call: _Call) -> web.StreamResponse:
    """Send 200 headers, then abort the TCP connection (RST, no body)."""
    response = await _open(call)
    transport = call.request.transport
    if transport is not None:
        transport.abort()
    return response


async def _fault_startup_delay(call: _Call) -> web.StreamResponse:
    """503 "Model is still loading" (reached only while the delay runs)."""
    response = _error_response(503, "Model is still loading", "ServiceUnavailableError")
    return await _send_whole(call, response)


_FAULT_HANDLERS: Mapping[str, Callable[[_Call], Awaitable[web.StreamResponse]]] = {
    "none": _fault_none,
    "hang_before_headers": _fault_hang_before_headers,
    "hang_after_headers": _fault_hang_after_headers,
    "hang_after_role_chunk": _fault_hang_after_role_chunk,
    "http_500": _fault_http_500,
    "cuda_error": _fault_cuda_error,
    "error_mid_stream": _fault_error_mid_stream,
    "overloaded": _fault_overloaded,
    "garbage_stream": _fault_garbage_stream,
    "close_after_headers": _fault_close_after_headers,
    "startup_delay": _fault_startup_delay,
    "slow_under_load": _fault_slow_under_load,
}


# ------------------------------------------------------------ serving


def _base_url(host: str, port: int) -> str:
    """``http://host:port`` with IPv6 hosts bracketed."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


async def _start(
    settings: SimSettings, host: str, ports: Sequence[int]
) -> tuple[web.AppRunner, SimHandle]:
    """Start one app listening on every port in ``ports`` (0: ephemeral); clean up on error."""
    if not ports:
        raise ValueError("at least one port is required")
    app = build_app(settings)
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S
    )
    await runner.setup()
    try:
        for port in ports:
            await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = tuple(dict.fromkeys(address[1] for address in runner.addresses))
    return runner, SimHandle(host=host, ports=bound, state=app[STATE_KEY], app=app)


async def serve(
    host: str,
    ports: Sequence[int],
    settings: SimSettings,
    *,
    on_ready: Callable[[SimHandle], None] | None = None,
) -> None:
    """Serve one simulator (one shared SimState) on every port until cancelled.

    Raises OSError if a port cannot be bound (nothing is left listening then).
    ``on_ready`` is called once every port listens. Cancellation shuts the server down
    (hangs released, handlers cancelled after at most ~1 s) and re-raises.
    """
    runner, handle = await _start(settings, host, ports)
    try:
        if on_ready is not None:
            on_ready(handle)
        await asyncio.get_running_loop().create_future()
    finally:
        await runner.cleanup()


@asynccontextmanager
async def running_sim(
    settings: SimSettings | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    port_count: int = 1,
) -> AsyncIterator[SimHandle]:
    """Run a simulator in this event loop for the duration of the ``async with`` block.

    With ``port=0`` every one of the ``port_count`` sites gets its own ephemeral port;
    otherwise ports ``port .. port+port_count-1`` are used. All share one state.
    """
    if port_count < 1:
        raise ValueError("port_count must be at least 1")
    ports = [0] * port_count if port == 0 else list(range(port, port + port_count))
    runner, handle = await _start(settings or SimSettings(), host, ports)
    try:
        yield handle
    finally:
        await runner.cleanup()
