"""The simulator's aiohttp application: routes, middleware and request handlers.

It speaks the vLLM flavour of the OpenAI API (``/v1/completions``,
``/v1/chat/completions``, ``/v1/models``, ``/health``, ``/metrics``) plus the info
endpoint of the engine it plays (``/version``, ``/get_server_info``, ``/info`` or
``/props``: :mod:`llm_health.sim.engines`), and adds a control plane under ``/sim/`` to
change the injected fault at run time and to read counters.
See ``docs/simulator.md`` for the user-facing contract. Each application owns one
:class:`~llm_health.sim.state.SimState`, stored under :data:`STATE_KEY`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from llm_health.sim.behaviours import serve_fault
from llm_health.sim.call import ClientGone, Stopping, begin_call, end_call, wait_for_client
from llm_health.sim.engines import ENGINES, info_document
from llm_health.sim.faults import FaultSpec
from llm_health.sim.metrics import (
    METRICS_CONTENT_TYPE,
    METRICS_GARBAGE,
    hostile_metrics,
    render_metrics,
)
from llm_health.sim.state import SimSettings, SimState
from llm_health.sim.wire import (
    BadRequest,
    Kind,
    check_auth,
    error_response,
    parse_params,
    read_json,
)

__all__ = ["STATE_KEY", "build_app"]

STATE_KEY = web.AppKey("llm_health_sim_state", SimState)
#: What the ``info`` knob hangs: the model list and every engine's info endpoint.
INFO_PATHS = frozenset({"/v1/models", *(engine.info_path for engine in ENGINES.values())})


def build_app(settings: SimSettings) -> web.Application:
    """Return the simulator application with a fresh :class:`SimState` under STATE_KEY.

    Run it with ``handler_cancellation=True`` (as :func:`llm_health.sim.server.serve`
    does) for immediate disconnect detection; without it disconnects are still seen
    within 0.5 s.
    """
    app = web.Application(middlewares=[_count_paths, _hang_info])
    state = SimState(settings)
    app[STATE_KEY] = state
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get(ENGINES[settings.engine].info_path, _engine_info)
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


@web.middleware
async def _hang_info(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The ``info`` knob "hang": ``GET /v1/models`` and every engine's info endpoint (the
    played engine's and, otherwise 404, the others') wait for ``hang_max``, then 504."""
    state = request.app[STATE_KEY]
    if state.fault.info != "hang" or request.method != "GET" or request.path not in INFO_PATHS:
        return await handler(request)
    return await _hang_then_504(request, state)


async def _hang_then_504(request: web.Request, state: SimState) -> web.Response:
    """No answer until ``hang_max`` (then 504), the client leaves or the server stops."""
    try:
        await wait_for_client(request, state, state.fault.hang_max)
    except ClientGone:
        return web.Response(status=499)  # never sent: the client is gone
    except Stopping:
        return error_response(503, "simulator shutting down", "ServiceUnavailableError")
    return error_response(504, "simulated hang ended after hang_max", "GatewayTimeoutError")


# ------------------------------------------------------------ simple endpoints


async def _health(request: web.Request) -> web.Response:
    """200 with an empty body whatever the fault (as a zombie engine does), unless the
    separate ``health`` knob says otherwise: "http_503", or "reset" (abort, no answer)."""
    mode = request.app[STATE_KEY].fault.health
    if mode == "reset" and request.transport is not None:
        request.transport.abort()
    return web.Response(status=503 if mode == "http_503" else 200)


async def _models(request: web.Request) -> web.Response:
    """The OpenAI model list, with the one model really served (``served_model`` knob)."""
    state = request.app[STATE_KEY]
    served = state.served_model
    model = {
        "id": served,
        "object": "model",
        "created": int(time.time()),
        "owned_by": ENGINES[state.settings.engine].owned_by,
        "root": served,
        "parent": None,
        "permission": [],
    }
    return web.json_response({"object": "list", "data": [model]})


async def _engine_info(request: web.Request) -> web.Response:
    """The played engine's info endpoint (``/version``, ``/get_server_info``, …)."""
    state = request.app[STATE_KEY]
    settings = state.settings
    document = info_document(settings.engine, state.served_model, settings.max_num_seqs)
    return web.json_response(document)


async def _metrics(request: web.Request) -> web.Response:
    """Prometheus text with the engine's gauge names, unless the ``metrics`` knob says
    otherwise: "404", "garbage" (200, not Prometheus text), "hang" or "hostile" (200, a
    document that costs a reader the most it may)."""
    state = request.app[STATE_KEY]
    mode = state.fault.metrics
    if mode == "404":
        return web.Response(status=404, text="404: Not Found")
    if mode == "hang":
        return await _hang_then_504(request, state)
    if state.fault.fault == "frozen":  # the API process answers; the engine core is stuck
        if state.frozen_metrics is None:
            state.frozen_metrics = render_metrics(state)
        body = state.frozen_metrics.encode()
    elif mode in ("garbage", "hostile"):
        body = METRICS_GARBAGE if mode == "garbage" else hostile_metrics()
    else:
        body = render_metrics(state).encode()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


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
        data = await read_json(request)
        spec = FaultSpec.from_json(data, base=state.fault)
    except ValueError as exc:
        return error_response(400, f"invalid fault spec: {exc}", "BadRequestError")
    was_frozen = state.fault.fault == "frozen"
    state.set_fault(spec)
    if spec.fault == "frozen" and not was_frozen:  # /metrics stays as it is this moment
        state.frozen_metrics = render_metrics(state)
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
    arrived = time.monotonic()
    state = request.app[STATE_KEY]
    try:
        check_auth(request, state.settings)
        params = parse_params(await read_json(request), kind, state.settings)
    except BadRequest as exc:
        if exc.status == 401:
            state.counters.unauthorized += 1
            return web.json_response({"error": "Unauthorized"}, status=401)
        state.counters.bad_requests += 1
        return error_response(exc.status, str(exc), exc.error_type)
    except ValueError as exc:
        state.counters.bad_requests += 1
        return error_response(400, str(exc), "BadRequestError")
    call = begin_call(request, state, kind, params, arrived)
    try:
        return await serve_fault(call)
    except (ClientGone, ConnectionError):
        call.outcome = "aborted"
        return call.response or web.Response(status=499)
    except asyncio.CancelledError:
        call.outcome = "aborted"
        raise
    except Stopping:
        call.outcome = "failed"
        if call.response is not None:
            return call.response
        return error_response(503, "simulator shutting down", "ServiceUnavailableError")
    finally:
        # Exactly once per counted call, whatever ended it (see llm_health.sim.call).
        end_call(call)
