"""gRPC adapter for ext_authz: ``envoy.service.auth.v3.Authorization/Check``.

Translates a CheckRequest into an ``AdmissionRequest``, asks the ``Gate`` (pure rules in
``llm_health.authz``), and translates the ``Decision`` back:
- allowed: ``status`` OK + ``ok_response`` (``headers`` with OVERWRITE_IF_EXISTS_OR_ADD,
  ``headers_to_remove``). Envoy applies them to the request before routing; with the
  filter's ``clear_route_cache`` a set header makes Envoy re-match the route.
- denied: ``status`` PERMISSION_DENIED + ``denied_response`` (HTTP status, headers, body):
  Envoy answers the client itself (service.auth.v3.DeniedHttpResponse). A deny is a normal
  answer; a gRPC error (INTERNAL) is only for a failure inside the plugin, and Envoy's
  ``failure_mode_allow`` then lets the request through.
"""

from __future__ import annotations

import logging
import threading
import time

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from envoy.type.v3 import http_status_pb2
from google.rpc import code_pb2, status_pb2  # type: ignore[import-untyped]

from llm_health.authz import PROBLEM_MESSAGE, AdmissionRequest, AuthzCounters, Checker, Decision
from llm_health.core.problems import ProblemLog
from llm_health.servers.decoding import rejecting_undecodable

log = logging.getLogger("llm_health.authz")

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
INTERNAL_MESSAGE = "llm-health: internal error"


class AuthorizationServicer(external_auth_pb2_grpc.AuthorizationServicer):  # type: ignore[misc]
    """Thin: translate, delegate to the gate, count. Runs on the server's event loop."""

    def __init__(self, gate: Checker, counters: AuthzCounters, problems: ProblemLog) -> None:
        self._gate, self._counters, self._problems = gate, counters, problems

    async def Check(
        self, request: external_auth_pb2.CheckRequest, context: grpc.aio.ServicerContext
    ) -> external_auth_pb2.CheckResponse:
        response = answer(request, self._gate, self._counters, self._problems)
        if response is None:
            await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
        return response


class ThreadedAuthorizationServicer(external_auth_pb2_grpc.AuthorizationServicer):  # type: ignore[misc]
    """The same on a threaded server (``server.authz``): checks run on its threads, one at
    a time under ``lock`` (the gate's view cache, the counters and the problem log are
    plain objects; whoever reads them elsewhere takes the same lock)."""

    def __init__(
        self, gate: Checker, counters: AuthzCounters, problems: ProblemLog, lock: threading.Lock
    ) -> None:
        self._gate, self._counters, self._problems = gate, counters, problems
        self._lock = lock

    def Check(
        self, request: external_auth_pb2.CheckRequest, context: grpc.ServicerContext
    ) -> external_auth_pb2.CheckResponse:
        with self._lock:
            response = answer(request, self._gate, self._counters, self._problems)
        if response is None:
            context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
        return response


def answer(
    request: external_auth_pb2.CheckRequest,
    gate: Checker,
    counters: AuthzCounters,
    problems: ProblemLog,
) -> external_auth_pb2.CheckResponse | None:
    """The CheckResponse for ``request``, counted; None after a failure inside the plugin
    (logged and counted: the caller answers INTERNAL and Envoy's failure_mode_allow lets
    the request through)."""
    started = time.perf_counter()
    try:
        decision = gate.check(admission_request(request))
        response = check_response(decision)
    except Exception:
        counters.internal_errors += 1
        log.exception("ext_authz check failed inside the plugin; Envoy fails open")
        return None
    counters.count(decision, time.perf_counter() - started)
    if decision.problem is not None:
        fields = decision.problem.log_fields(decision.cluster)
        problems.report(decision.problem.kind, PROBLEM_MESSAGE, fields)
    return response


def admission_request(request: external_auth_pb2.CheckRequest) -> AdmissionRequest:
    """Headers from ``attributes.request.http.headers`` and, when Envoy's
    ``encode_raw_headers`` is on, ``header_map`` (names lower-cased, repeats comma-joined);
    ``attributes.context_extensions`` as set on the route."""
    attributes = request.attributes
    http = attributes.request.http
    headers: dict[str, str] = {}
    size = 0
    for key, value in http.headers.items():
        size += len(key) + len(value)
        _add(headers, key.lower(), value)
    for entry in http.header_map.headers:
        value = entry.raw_value.decode("utf-8", "replace") if entry.raw_value else entry.value
        size += len(entry.key) + len(value)
        _add(headers, entry.key.lower(), value)
    return AdmissionRequest(headers, dict(attributes.context_extensions), size)


def _add(headers: dict[str, str], key: str, value: str) -> None:
    headers[key] = f"{headers[key]},{value}" if key in headers else value


def check_response(decision: Decision) -> external_auth_pb2.CheckResponse:
    if decision.allowed:
        return external_auth_pb2.CheckResponse(
            status=status_pb2.Status(code=code_pb2.OK),
            ok_response=external_auth_pb2.OkHttpResponse(
                headers=[_header(k, v) for k, v in decision.set_headers],
                headers_to_remove=decision.remove_headers,
            ),
        )
    return external_auth_pb2.CheckResponse(
        status=status_pb2.Status(code=code_pb2.PERMISSION_DENIED, message=decision.rule.value),
        denied_response=external_auth_pb2.DeniedHttpResponse(
            status=http_status_pb2.HttpStatus(code=decision.status),
            headers=[_header(k, v) for k, v in decision.reply_headers],
            body=decision.body,
        ),
    )


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, value=value), append_action=_OVERWRITE
    )


def add_authz_servicer(
    server: grpc.aio.Server, gate: Checker, counters: AuthzCounters, problems: ProblemLog
) -> None:
    """Register ``envoy.service.auth.v3.Authorization`` on ``server`` (before it starts)."""
    servicer = AuthorizationServicer(gate, counters, problems)
    lenient = rejecting_undecodable(server)  # undecodable bytes: INVALID_ARGUMENT
    external_auth_pb2_grpc.add_AuthorizationServicer_to_server(servicer, lenient)


def add_threaded_authz_servicer(
    server: grpc.Server,
    gate: Checker,
    counters: AuthzCounters,
    problems: ProblemLog,
    lock: threading.Lock,
) -> None:
    """Register ``Authorization`` on a threaded server (``create_threaded_grpc_server``)."""
    servicer = ThreadedAuthorizationServicer(gate, counters, problems, lock)
    lenient = rejecting_undecodable(server)  # undecodable bytes: INVALID_ARGUMENT
    external_auth_pb2_grpc.add_AuthorizationServicer_to_server(servicer, lenient)
