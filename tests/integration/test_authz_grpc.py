"""ext_authz Check over real gRPC, in process (a grpc.aio server on 127.0.0.1:0): the
translation both ways, and missing or absurd attributes get a sane answer and a log line,
never a crash or a gRPC error (only an internal failure is a gRPC error)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc

from llm_health.authz import AuthzConfig, AuthzCounters, Gate
from llm_health.authz.component import AuthzComponent
from llm_health.core.hub import SnapshotHub
from llm_health.core.problems import ProblemLog
from llm_health.model.board import Board, ClusterSpec, EndpointSpec, HealthSnapshot
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.servers.authz import add_authz_servicer
from llm_health.servers.grpc import start_grpc_server

pytestmark = pytest.mark.timeout(30)

CLUSTER = "llama-70b"
ADDRESSES = ("127.0.0.1:9001", "127.0.0.1:9002")
OK, PERMISSION_DENIED = 0, 7
MB = 1024 * 1024


@dataclass
class Service:
    stub: Any
    board: Board
    hub: SnapshotHub
    counters: AuthzCounters
    settings: list[AuthzConfig]

    async def check(self, **kwargs: Any) -> Any:
        return await self.stub.Check(check_request(**kwargs), timeout=5)

    async def set_states(self, *outcomes: Outcome) -> None:
        for address, outcome in zip(ADDRESSES, outcomes, strict=True):
            self.board.record(CLUSTER, address, ProbeResult(outcome, 0.0, ttft_ms=10), 1.0)
        self.hub.put(self.board.snapshot())


def check_request(
    headers: dict[str, str] | None = None,
    cluster: str | None = CLUSTER,
    raw: list[tuple[str, bytes]] | None = None,
) -> Any:
    request = external_auth_pb2.CheckRequest()
    http = request.attributes.request.http
    http.headers.update(headers or {})
    for key, value in raw or []:
        http.header_map.headers.add(key=key, raw_value=value)
    if cluster is not None:
        request.attributes.context_extensions["llm_cluster"] = cluster
    return request


def board() -> Board:
    spec = ClusterSpec(
        CLUSTER,
        Policy(healthy_after=1),
        tuple(EndpointSpec(a, "127.0.0.1", int(a[-4:]), 100) for a in ADDRESSES),
    )
    result = Board([spec], now=0.0, wall_offset=0.0)
    for address in ADDRESSES:
        result.record(CLUSTER, address, ProbeResult(Outcome.FAST, 0.0, ttft_ms=10), 0.5)
    return result


async def serve(snapshot: Callable[[], HealthSnapshot] | None = None) -> AsyncIterator[Service]:
    the_board = board()
    hub = SnapshotHub(the_board.snapshot())
    settings = [AuthzConfig()]
    counters = AuthzCounters()
    gate = Gate(snapshot or hub.current, lambda: settings[0])
    server, port = await start_grpc_server("127.0.0.1:0")
    add_authz_servicer(
        server, gate, counters, ProblemLog(logging.getLogger("llm_health.authz"), every_s=0.0)
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = external_auth_pb2_grpc.AuthorizationStub(channel)
            yield Service(stub, the_board, hub, counters, settings)
    finally:
        await server.stop(0)


@pytest.fixture
async def service() -> AsyncIterator[Service]:
    async for running in serve():
        yield running


def ok_headers(response: Any) -> dict[str, str]:
    return {h.header.key: h.header.value for h in response.ok_response.headers}


def problem_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.problem for r in caplog.records if r.name == "llm_health.authz" and hasattr(r, "problem")
    ]


# --------------------------------------------------------------------------- translation


async def test_allowed_answer(service: Service) -> None:
    response = await service.check(headers={"x-llm-priority": "high"})
    assert response.status.code == OK
    assert ok_headers(response) == {"x-llm-route": "healthy", "x-llm-capacity": "1.00"}
    overwrite = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert {h.append_action for h in response.ok_response.headers} == {overwrite}
    assert not response.HasField("denied_response")


async def test_denied_answer(service: Service) -> None:
    await service.set_states(Outcome.FATAL, Outcome.FATAL)
    response = await service.check()
    assert response.status.code == PERMISSION_DENIED
    denied = response.denied_response
    assert denied.status.code == 503
    assert {h.header.key: h.header.value for h in denied.headers}["retry-after"] == "1"
    assert '"type":"no_capacity"' in denied.body
    assert not response.HasField("ok_response")
    assert service.counters.as_dict()["decisions"] == {CLUSTER: {"no_capacity": 1}}


async def test_mixed_case_and_raw_headers_are_read(service: Service) -> None:
    """Envoy lower-cases header names; other callers may not. With Envoy's
    encode_raw_headers the headers come as bytes in header_map instead."""
    response = await service.check(headers={"X-LLM-Probe": "true"})
    assert list(response.ok_response.headers_to_remove) == ["x-llm-probe"]
    raw = await service.check(raw=[("x-llm-priority", b"high"), ("X-LLM-Probe", b"1")])
    assert ok_headers(raw)["x-llm-route"] == "healthy"
    assert list(raw.ok_response.headers_to_remove) == ["x-llm-probe"]


# --------------------------------------------------------------------------- absurd input


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"cluster": None}, "no_cluster"),  # no headers, no context extensions at all
        ({"cluster": "no-such-cluster"}, "unknown_cluster"),
        ({"cluster": None, "headers": {"x-llm-cluster": "z" * 10_000}}, "unknown_cluster"),
        ({"headers": {"x-junk": "j" * MB}}, "oversized_headers"),
        ({"headers": {"x-llm-priority": "low" * (MB // 3)}}, "oversized_headers"),
        (
            {"raw": [("x-llm-priority", b"\xff\xfe\x00" * 100)], "cluster": "\x00\u202e"},
            "unknown_cluster",
        ),
    ],
    ids=["empty", "unknown", "huge-name", "1MB-header", "1MB-priority", "binary"],
)
async def test_absurd_requests_get_a_sane_answer_and_a_log_line(
    service: Service, caplog: pytest.LogCaptureFixture, kwargs: dict[str, Any], problem: str
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_health.authz")
    response = await service.check(**kwargs)
    assert response.status.code == OK  # allowed: a health gate does not guess
    assert problem_lines(caplog) == [problem]
    assert all(len(r.getMessage()) + len(str(r.__dict__)) < 2000 for r in caplog.records)
    # ... and the service keeps answering normally.
    assert ok_headers(await service.check()) == {"x-llm-capacity": "1.00"}


async def test_a_request_over_grpc_limits_is_refused_by_grpc_and_the_service_lives_on(
    service: Service,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await service.check(headers={"x-junk": "j" * (5 * MB)})  # grpc's default max is 4 MB
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await service.check()).status.code == OK


async def test_internal_failure_is_a_grpc_error_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Envoy's failure_mode_allow turns this into "allowed" (see the e2e fail-open test)."""
    calls = [0]
    good = board().snapshot()

    def flaky() -> HealthSnapshot:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("boom")
        return good

    async for service in serve(flaky):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await service.check()
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert service.counters.internal_errors == 1
        assert any(r.exc_info for r in caplog.records if r.name == "llm_health.authz")
        assert (await service.check()).status.code == OK


async def test_settings_changes_apply_to_the_next_check(service: Service) -> None:
    service.settings[0] = service.settings[0].model_copy(update={"probe_header": "deny"})
    response = await service.check(headers={"x-llm-probe": "true"})
    assert (response.status.code, response.denied_response.status.code) == (PERMISSION_DENIED, 403)


async def test_a_flood_of_odd_requests_logs_one_line_per_kind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The component's own problem log (PROBLEM_LOG_EVERY_S per kind): 200 checks naming
    unknown clusters, 200 naming none, are two lines; the counters have them all."""
    hub = SnapshotHub(board().snapshot())
    component = AuthzComponent(hub, AuthzConfig)
    server, port = await start_grpc_server("127.0.0.1:0")
    component.register(server)
    await server.start()
    caplog.set_level(logging.WARNING, logger="llm_health.authz")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = external_auth_pb2_grpc.AuthorizationStub(channel)
            for n in range(200):
                await stub.Check(check_request(cluster=f"ghost-{n}"), timeout=5)
                await stub.Check(check_request(cluster=None), timeout=5)
    finally:
        await server.stop(0)
    assert sorted(problem_lines(caplog)) == ["no_cluster", "unknown_cluster"]
    assert component.status()["problems"] == {"unknown_cluster": 200, "no_cluster": 200}
