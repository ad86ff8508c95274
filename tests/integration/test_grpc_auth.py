"""Authentication of the main gRPC port (``server.token``, ``server.tls``) and the HDS
hardening, in process over real gRPC on loopback, against a real runtime.

- every service on the port (ADS, standalone EDS, HDS, ext_authz, admin) answers
  UNAUTHENTICATED without or with a wrong ``authorization: Bearer`` token and works with
  the right one; the interceptor returns a handler of every streaming kind;
- /status shows ``grpc_auth`` (mode, rejected_total), never the token; refusals are
  logged at most once per peer, never with the token;
- mutual TLS (throwaway CA from the ``openssl`` CLI): a client certificate is required;
- the finding: fake HDS gateways without the token eject nothing; with no token on
  loopback, fake gateways without an xDS stream eject nothing, and fake gateways that
  also open an xDS stream eject at most the max_ejection_percent share; authenticated
  reporters are not capped;
- the config rules of ``server.token`` / ``server.tls``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import health_check_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc
from envoy.service.health.v3 import hds_pb2, hds_pb2_grpc
from envoy.service.runtime.v3 import rtds_pb2_grpc

from llm_health.adminpb import admin_pb2 as pb
from llm_health.adminpb import admin_pb2_grpc as pb_grpc
from llm_health.app.runtime import Runtime
from llm_health.config import parse_config
from llm_health.core.tokens import REFUSED_LOG_EVERY_S, REFUSING_PEERS
from llm_health.errors import ConfigError
from llm_health.model.states import State
from llm_health.servers.grpc import BearerTokenInterceptor, GrpcAuthStats, start_grpc_server
from llm_health.xds.resources import TYPE_URL
from llm_health.xds.runtime import LAYER_NAME as LAYER
from llm_health.xds.runtime import RUNTIME_TYPE_URL
from tests.configs import Endpoints, plugin_yaml
from tests.polling import wait_until_async
from tests.ports import free_port
from tests.processes import SimProcess, http_json
from tests.runtime import Running

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.sims(3, "--ttft", "20ms", prefix="s", per_module=True),
]

TOKEN = "s3cret-token-0123456789abcdef"
WRONG = "wrong-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
CLUSTER = "llama"
Metadata = tuple[tuple[str, str], ...]
BEARER: Metadata = (("authorization", f"Bearer {TOKEN}"),)
NO_TOKEN: Metadata = ()
WRONG_TOKEN: Metadata = (("authorization", f"Bearer {WRONG}"),)
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
FAKE_REPORT_EVERY_S = 0.25
# An UNHEALTHY report within this long of an assignment does not count yet: the check
# timeout (200 ms in config_text) plus the hds module's FIRST_CHECK_MARGIN_S (1 s).
FIRST_CHECK_GRACE_S = 0.2 + 1.0


def config_text(endpoints: Endpoints, *, server: Any = None, admin: Any = None) -> str:
    """Probes once a minute; fast HDS; ``server``: more keys of that section."""
    return plugin_yaml(
        endpoints,
        cluster=CLUSTER,
        server=server,
        probe={"model": "sim-model", "interval": "60s", "healthy_after": 1},
        xds={"warm_start_timeout": "2s"},
        hds={"timeout": "200ms", "interval": "500ms", "report_interval": "500ms"},
        admin=admin,
    )


@contextlib.asynccontextmanager
async def running(text: str) -> AsyncIterator[Runtime]:
    """The runtime of ``text``, ready, for the length of the block."""
    async with Running.from_config(text, "auth-test.yaml") as started:
        yield (await started.ready()).runtime


def dead_addresses(count: int = 2) -> list[str]:
    """Endpoints nothing listens on: probes fail fast (ERROR), which still warms the
    cluster, so xDS answers."""
    return [f"127.0.0.1:{free_port()}" for _ in range(count)]


# --------------------------------------------------------------------------- calls


async def first_of_stream(call_method: Callable[..., Any], request: Any, md: Metadata) -> Any:
    """Open a client-streaming call, send ``request``, return the first response (or
    raise AioRpcError); the call is cancelled afterwards."""
    done = asyncio.Event()

    async def requests() -> AsyncIterator[Any]:
        yield request
        await done.wait()

    call = call_method(requests(), metadata=md)
    try:
        return await asyncio.wait_for(call.read(), 5)
    finally:
        done.set()
        call.cancel()


async def code_of(make: Callable[[], Any]) -> grpc.StatusCode:
    try:
        await make()
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def hello(node: str) -> hds_pb2.HealthCheckRequestOrEndpointHealthResponse:
    message = hds_pb2.HealthCheckRequestOrEndpointHealthResponse()
    message.health_check_request.node.id = node
    message.health_check_request.capability.health_check_protocols.extend(
        [hds_pb2.Capability.HTTP, hds_pb2.Capability.TCP]
    )
    return message


def all_unhealthy(addresses: list[str]) -> hds_pb2.HealthCheckRequestOrEndpointHealthResponse:
    """A report (Envoy's flat form) saying every address is UNHEALTHY."""
    message = hds_pb2.HealthCheckRequestOrEndpointHealthResponse()
    response = message.endpoint_health_response
    response.SetInParent()
    for address in addresses:
        host, port = address.rsplit(":", 1)
        health = response.endpoints_health.add(health_status=health_check_pb2.UNHEALTHY)
        health.endpoint.address.socket_address.address = host
        health.endpoint.address.socket_address.port_value = int(port)
    return message


def xds_request(node: str) -> discovery_pb2.DiscoveryRequest:
    request = discovery_pb2.DiscoveryRequest(type_url=TYPE_URL, resource_names=[CLUSTER])
    request.node.id = node
    return request


def rtds_request(node: str) -> discovery_pb2.DiscoveryRequest:
    request = discovery_pb2.DiscoveryRequest(type_url=RUNTIME_TYPE_URL, resource_names=[LAYER])
    request.node.id = node
    return request


SERVICES: dict[str, Callable[[grpc.aio.Channel, Metadata], Any]] = {
    "ads": lambda ch, md: first_of_stream(
        ads_pb2_grpc.AggregatedDiscoveryServiceStub(ch).StreamAggregatedResources,
        xds_request("gw-ads"),
        md,
    ),
    "eds": lambda ch, md: first_of_stream(
        eds_pb2_grpc.EndpointDiscoveryServiceStub(ch).StreamEndpoints, xds_request("gw-eds"), md
    ),
    "hds": lambda ch, md: first_of_stream(
        hds_pb2_grpc.HealthDiscoveryServiceStub(ch).StreamHealthCheck, hello("gw-hds"), md
    ),
    "rtds": lambda ch, md: first_of_stream(
        rtds_pb2_grpc.RuntimeDiscoveryServiceStub(ch).StreamRuntime, rtds_request("gw-rtds"), md
    ),
    "ext_authz": lambda ch, md: external_auth_pb2_grpc.AuthorizationStub(ch).Check(
        external_auth_pb2.CheckRequest(), metadata=md, timeout=5
    ),
    "admin_unary": lambda ch, md: pb_grpc.AdminStub(ch).ListEndpoints(
        pb.ListEndpointsRequest(), metadata=md, timeout=5
    ),
    "admin_server_stream": lambda ch, md: _first_watch(ch, md),
    "access_log": lambda ch, md: _one_access_log(ch, md),
}


async def _one_access_log(channel: grpc.aio.Channel, md: Metadata) -> Any:
    """A client stream of one (empty) batch; the answer comes when it ends."""
    message = als_pb2.StreamAccessLogsMessage()
    message.identifier.node.id = "gw-als"
    message.http_logs.log_entry.add()

    async def one() -> Any:
        yield message

    stub = als_pb2_grpc.AccessLogServiceStub(channel)
    return await stub.StreamAccessLogs(one(), metadata=md, timeout=5)


async def _first_watch(channel: grpc.aio.Channel, md: Metadata) -> Any:
    call = pb_grpc.AdminStub(channel).WatchEndpoints(pb.WatchEndpointsRequest(), metadata=md)
    try:
        return await asyncio.wait_for(call.read(), 5)
    finally:
        call.cancel()


# --------------------------------------------------------------------------- token


@pytest.fixture
async def guarded() -> AsyncIterator[Runtime]:
    async with running(config_text(dead_addresses(), server={"token": TOKEN})) as runtime:
        yield runtime


# Streams the client writes into at once (bidirectional): a client still writing when the
# server's refusal arrives may see grpcio's client-side INTERNAL instead of the refusal.
# The server's own count of refusals is what proves every call was refused.
WRITING_STREAMS = {"ads", "eds", "hds", "rtds"}


@pytest.mark.parametrize("service", sorted(SERVICES))
async def test_every_service_needs_the_token(guarded: Runtime, service: str) -> None:
    call = SERVICES[service]
    refused = {UNAUTH, grpc.StatusCode.INTERNAL} if service in WRITING_STREAMS else {UNAUTH}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{guarded.grpc_port}") as channel:
        assert await code_of(lambda: call(channel, NO_TOKEN)) in refused
        assert await code_of(lambda: call(channel, WRONG_TOKEN)) in refused
        assert await code_of(lambda: call(channel, (("authorization", TOKEN),))) in refused
        assert await code_of(lambda: call(channel, BEARER)) == grpc.StatusCode.OK
    assert guarded.status()["grpc_auth"]["rejected_total"] == 3


async def test_status_counts_refusals_and_never_shows_or_logs_the_token(
    guarded: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{guarded.grpc_port}") as channel:
        for metadata in (NO_TOKEN, WRONG_TOKEN) * 3:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await SERVICES["ext_authz"](channel, metadata)
            assert caught.value.code() == UNAUTH
            assert TOKEN not in str(caught.value.details())
        await SERVICES["ext_authz"](channel, BEARER)
    status = await asyncio.to_thread(http_json, f"http://127.0.0.1:{guarded.http_port}/status")
    assert status["grpc_auth"] == {"mode": "bearer token", "rejected_total": 6, "tls": False}
    assert status["hds"]["ejection_cap"] == "none (authenticated)"
    assert TOKEN not in json.dumps(status)
    metrics = await asyncio.to_thread(
        lambda: (
            __import__("urllib.request")
            .request.urlopen(f"http://127.0.0.1:{guarded.http_port}/metrics", timeout=5)
            .read()
        )
    )
    assert TOKEN.encode() not in metrics
    refusals = [r for r in caplog.records if "refused" in r.getMessage() and "gRPC" in r.msg]
    assert len(refusals) == 1, "one warning per peer per minute"
    assert refusals[0].levelno == logging.WARNING
    for record in caplog.records:
        assert TOKEN not in record.getMessage()
        assert TOKEN not in repr(record.__dict__)


async def test_admin_token_keeps_its_own_check_next_to_the_server_token() -> None:
    text = config_text(dead_addresses(), server={"token": TOKEN}, admin={"token": ADMIN_TOKEN})
    admin_bearer = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
    admin, ads = SERVICES["admin_unary"], SERVICES["ads"]
    async with (
        running(text) as runtime,
        grpc.aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel,
    ):
        assert await code_of(lambda: admin(channel, admin_bearer)) == grpc.StatusCode.OK
        assert await code_of(lambda: admin(channel, BEARER)) == UNAUTH  # admin's own check
        assert await code_of(lambda: ads(channel, admin_bearer)) == UNAUTH
        assert await code_of(lambda: ads(channel, BEARER)) == grpc.StatusCode.OK


async def test_without_a_token_on_loopback_nothing_is_asked() -> None:
    async with running(config_text(dead_addresses())) as runtime:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            for name, call in SERVICES.items():
                assert await code_of(lambda c=call: c(channel, NO_TOKEN)) == grpc.StatusCode.OK, (
                    name
                )
        assert runtime.status()["grpc_auth"] == {"mode": "none", "rejected_total": 0, "tls": False}
        assert runtime.status()["hds"]["ejection_cap"] == "max_ejection_percent"


def test_refusals_flooding_from_one_host_or_many_stay_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """1,000 refusals from one host (a new port each) are one line per minute; 5,000 hosts
    are at most REFUSING_PEERS lines, and once the minute is over a host logs again."""
    now = [0.0]
    interceptor = BearerTokenInterceptor(TOKEN, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="llm_health.grpc")

    def refusals() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "gRPC call refused" in r.getMessage()]

    for port in range(1_000):
        interceptor.warn_refused(f"ipv4:192.0.2.1:{port}", "/x.X/Y")
    assert [(vars(r)["peer"], vars(r)["suppressed"]) for r in refusals()] == [("ipv4:192.0.2.1", 0)]
    for n in range(5_000):
        interceptor.warn_refused(f"ipv6:[2001:db8::{n:x}]:443", "/x.X/Y")
    assert len(refusals()) == REFUSING_PEERS
    now[0] = REFUSED_LOG_EVERY_S
    interceptor.warn_refused("ipv4:192.0.2.1:5", "/x.X/Y")
    last = vars(refusals()[-1])
    assert (last["peer"], last["suppressed"]) == ("ipv4:192.0.2.1", 999)


def test_threaded_refusals_share_the_bounded_log(caplog: pytest.LogCaptureFixture) -> None:
    """The threaded ext_authz server refuses on four threads at once: one line per host."""
    interceptor = BearerTokenInterceptor(TOKEN)
    caplog.set_level(logging.WARNING, logger="llm_health.grpc")

    def flood(thread: int) -> None:
        for n in range(1_000):
            interceptor.warn_refused(f"ipv4:192.0.2.{n % 20}:{thread}", "/x.X/Y")

    threads = [threading.Thread(target=flood, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    hosts = [vars(r)["peer"] for r in caplog.records if "gRPC call refused" in r.getMessage()]
    assert sorted(hosts) == sorted(f"ipv4:192.0.2.{n}" for n in range(20))


# --------------------------------------------------------------------------- every kind


def _identity(data: bytes) -> bytes:
    return data


async def test_the_interceptor_keeps_every_streaming_kind() -> None:
    """unary-unary, unary-stream, stream-unary, stream-stream: refused ones get
    UNAUTHENTICATED (not a crash or UNKNOWN), accepted ones reach the method."""

    async def uu(request: bytes, _: Any) -> bytes:
        return b"uu:" + request

    async def us(request: bytes, _: Any) -> AsyncIterator[bytes]:
        yield b"us:" + request

    async def su(requests: AsyncIterator[bytes], _: Any) -> bytes:
        return b"su:" + b"".join([r async for r in requests])

    async def ss(requests: AsyncIterator[bytes], _: Any) -> AsyncIterator[bytes]:
        async for r in requests:
            yield b"ss:" + r

    serde = {"request_deserializer": _identity, "response_serializer": _identity}
    handlers = {
        "UU": grpc.unary_unary_rpc_method_handler(uu, **serde),
        "US": grpc.unary_stream_rpc_method_handler(us, **serde),
        "SU": grpc.stream_unary_rpc_method_handler(su, **serde),
        "SS": grpc.stream_stream_rpc_method_handler(ss, **serde),
    }
    stats = GrpcAuthStats("bearer token")
    interceptor = BearerTokenInterceptor(TOKEN, stats=stats)
    server, port = await start_grpc_server("127.0.0.1:0", interceptors=[interceptor])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", handlers),))
    await server.start()

    async def one() -> AsyncIterator[bytes]:
        yield b"x"

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            kinds: dict[str, Callable[[Metadata], Any]] = {
                "UU": lambda md: channel.unary_unary("/t.T/UU")(b"x", metadata=md),
                "US": lambda md: _read_all(channel.unary_stream("/t.T/US")(b"x", metadata=md)),
                "SU": lambda md: channel.stream_unary("/t.T/SU")(one(), metadata=md),
                "SS": lambda md: _read_all(channel.stream_stream("/t.T/SS")(one(), metadata=md)),
            }
            for name, call in kinds.items():
                assert await code_of(lambda c=call: c(WRONG_TOKEN)) == UNAUTH, name
                assert await code_of(lambda c=call: c(NO_TOKEN)) == UNAUTH, name
                answer = await call(BEARER)
                assert answer in (f"{name.lower()}:x".encode(), [f"{name.lower()}:x".encode()])
    finally:
        await server.stop(0)
    assert stats.rejected_total == 8


async def _read_all(call: Any) -> list[bytes]:
    return [message async for message in call]


# --------------------------------------------------------------------------- mTLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate,
    made with the openssl CLI (the cryptography package is not installed)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI")
    d = tmp_path_factory.mktemp("pki")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "1", "-subj", "/CN=llm-health test CA")  # fmt: skip
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *ext)  # fmt: skip
    return {p.stem + p.suffix.replace(".", "_"): p for p in d.iterdir()}


async def test_mutual_tls_requires_a_client_certificate(pki: dict[str, Path]) -> None:
    files = {"cert": pki["server_pem"], "key": pki["server_key"], "client_ca": pki["ca_pem"]}
    tls = {"tls": {name: str(path) for name, path in files.items()}}
    ca = pki["ca_pem"].read_bytes()
    async with running(config_text(dead_addresses(), server=tls)) as runtime:
        assert runtime.status()["grpc_auth"] == {"mode": "mtls", "rejected_total": 0, "tls": True}
        assert runtime.status()["hds"]["ejection_cap"] == "none (authenticated)"
        target = f"127.0.0.1:{runtime.grpc_port}"
        with_cert = grpc.ssl_channel_credentials(
            ca, pki["client_key"].read_bytes(), pki["client_pem"].read_bytes()
        )
        async with grpc.aio.secure_channel(target, with_cert) as channel:
            answer = await SERVICES["ads"](channel, NO_TOKEN)
            assert answer.type_url == TYPE_URL
        async with grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(ca)) as channel:
            assert await code_of(lambda: SERVICES["ext_authz"](channel, NO_TOKEN)) in (
                grpc.StatusCode.UNAVAILABLE,
                UNAUTH,
            )
        async with grpc.aio.insecure_channel(target) as channel:
            assert (
                await code_of(lambda: SERVICES["ext_authz"](channel, NO_TOKEN))
                == grpc.StatusCode.UNAVAILABLE
            )


# --------------------------------------------------------------------------- the finding


class FakeGateways:
    """``count`` clients posing as gateways: each opens an HDS stream (and, with
    ``with_xds``, an ADS stream under the same node id first) and reports every endpoint
    UNHEALTHY four times a second. ``codes``: how their calls ended."""

    def __init__(
        self, channel: grpc.aio.Channel, count: int, addresses: list[str], md: Metadata
    ) -> None:
        self.channel, self.count, self.addresses, self.md = channel, count, addresses, md
        self.stop = asyncio.Event()
        self.codes: list[grpc.StatusCode] = []
        self.tasks: list[asyncio.Task[None]] = []

    def nodes(self) -> list[str]:
        return [f"fake-gw-{i}" for i in range(self.count)]

    async def start(self, *, xds_open: Callable[[str], bool] | None) -> FakeGateways:
        """With ``xds_open`` (the plugin's "has this node an xDS stream"), every fake
        opens its xDS stream first and reports once the plugin holds it (or refused it)."""
        if xds_open is not None:
            ads = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
            streams = {
                node: self._spawn(ads.StreamAggregatedResources, self._xds(node))
                for node in self.nodes()
            }
            await wait_until_async(
                lambda: all(xds_open(node) or streams[node].done() for node in streams),
                10,
                "the fakes' xDS streams open (or refused)",
            )
        hds = hds_pb2_grpc.HealthDiscoveryServiceStub(self.channel)
        for node in self.nodes():
            self._spawn(hds.StreamHealthCheck, self._hds(node))
        return self

    def _spawn(
        self, method: Callable[..., Any], requests: AsyncIterator[Any]
    ) -> asyncio.Task[None]:
        task = asyncio.create_task(self._drain(method(requests, metadata=self.md)))
        self.tasks.append(task)
        return task

    async def _drain(self, call: Any) -> None:
        try:
            async for _ in call:
                pass
            self.codes.append(grpc.StatusCode.OK)
        except grpc.aio.AioRpcError as exc:
            self.codes.append(exc.code())
        except asyncio.CancelledError:
            call.cancel()
            raise

    async def _xds(self, node: str) -> AsyncIterator[Any]:
        yield xds_request(node)
        await self.stop.wait()

    async def _hds(self, node: str) -> AsyncIterator[Any]:
        yield hello(node)
        while not self.stop.is_set():
            yield all_unhealthy(self.addresses)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), FAKE_REPORT_EVERY_S)

    async def close(self) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def unhealthy(runtime: Runtime) -> list[str]:
    endpoints = runtime.control.published().clusters[CLUSTER].endpoints
    return [e.spec.address for e in endpoints if e.state is State.UNHEALTHY]


@contextlib.asynccontextmanager
async def attack(
    runtime: Runtime, count: int, md: Metadata, *, with_xds: bool
) -> AsyncIterator[FakeGateways]:
    addresses = [t.address for t in runtime.targets]
    assert unhealthy(runtime) == []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
        fakes = FakeGateways(channel, count, addresses, md)
        await fakes.start(xds_open=runtime.xds_nodes.is_open if with_xds else None)
        try:
            yield fakes
        finally:
            await fakes.close()


async def test_fake_gateways_without_the_token_eject_nothing(sims: list[SimProcess]) -> None:
    text = config_text(sims, server={"token": TOKEN})
    async with running(text) as runtime:
        async with attack(runtime, 8, NO_TOKEN, with_xds=True) as fakes:
            # Every call refused and ended: no report of theirs can come in any more.
            await wait_until_async(lambda: len(fakes.codes) == 16, 10, "all 16 calls refused")
            assert unhealthy(runtime) == []
            # The server refused all 16 calls. A client still writing its next message
            # when the refusal arrives may see grpcio's client-side INTERNAL instead.
            assert len(fakes.codes) == 16 and UNAUTH in fakes.codes
            assert set(fakes.codes) <= {UNAUTH, grpc.StatusCode.INTERNAL}
        hds = runtime.status()["hds"]
        assert hds["stats"]["reports"] == 0 and hds["nodes"] == []
        assert runtime.status()["grpc_auth"]["rejected_total"] == 16


async def test_fake_gateways_without_an_xds_stream_eject_nothing(
    sims: list[SimProcess], caplog: pytest.LogCaptureFixture
) -> None:
    async with running(config_text(sims)) as runtime:
        async with attack(runtime, 8, NO_TOKEN, with_xds=False):
            # Nothing may happen: past the first-check grace, two more rounds of reports
            # would have taken the endpoints out, had they counted.
            await asyncio.sleep(FIRST_CHECK_GRACE_S + 2 * FAKE_REPORT_EVERY_S)
            assert unhealthy(runtime) == []
        stats = runtime.status()["hds"]["stats"]
        assert stats["reports_without_xds"] >= 8
        assert stats["reports"] == 0
    ignored = [r for r in caplog.records if "holds no xDS stream" in r.getMessage()]
    assert len(ignored) == 8  # once per node


@pytest.mark.parametrize("count", [8, 40])
async def test_fake_gateways_with_xds_streams_eject_at_most_max_ejection_percent(
    sims: list[SimProcess], count: int
) -> None:
    """3 endpoints, max_ejection_percent 50: at most 1 may go out by HDS (the finding:
    1 of 3 with 8 fake gateways, 2 of 3 with 40)."""
    text = config_text(sims)
    async with running(text) as runtime, attack(runtime, count, NO_TOKEN, with_xds=True):
        await wait_until_async(lambda: len(unhealthy(runtime)) == 1, 10, "one ejection")
        await wait_until_async(
            lambda: runtime.status()["hds"]["held_now"] == 2, 10, "the other two verdicts held"
        )
        # Nothing more may go out: two more rounds of every fake's reports stay held.
        await asyncio.sleep(2 * FAKE_REPORT_EVERY_S)
        assert len(unhealthy(runtime)) == 1
        hds = runtime.status()["hds"]
        assert hds["stats"]["held_verdicts"] == 2 and hds["held_now"] == 2
        assert hds["ejection_cap"] == "max_ejection_percent"


async def test_authenticated_reporters_are_not_capped(sims: list[SimProcess]) -> None:
    text = config_text(sims, server={"token": TOKEN})
    async with running(text) as runtime:
        async with attack(runtime, 4, BEARER, with_xds=True):
            await wait_until_async(lambda: len(unhealthy(runtime)) == 3, 10, "all three out")
        assert runtime.status()["hds"]["stats"]["held_verdicts"] == 0


# --------------------------------------------------------------------------- config rules

BASE = "clusters:\n  - name: a\n    endpoints: [{address: 127.0.0.1:8000}]\n"


@pytest.mark.parametrize("bind", ["0.0.0.0:18000", "10.0.0.5:18000", "[::]:18000", "gw:18000"])
def test_a_non_loopback_port_needs_a_token_or_mutual_tls(bind: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f'server: {{grpc: "{bind}"}}\n' + BASE, "x.yaml", {})
    (message,) = caught.value.messages
    assert "server.token" in message and "server.tls.client_ca" in message, message
    pem = tmp_path / "x.pem"
    pem.write_text("not checked here")
    only_tls = f'server: {{grpc: "{bind}", tls: {{cert: "{pem}", key: "{pem}"}}}}\n'
    with pytest.raises(ConfigError):  # TLS without client certificates authenticates nobody
        parse_config(only_tls + BASE, "x.yaml", {})
    mtls = f'server: {{grpc: "{bind}", tls: {{cert: "{pem}", key: "{pem}", client_ca: "{pem}"}}}}\n'
    assert parse_config(mtls + BASE, "x.yaml", {}).server.tls is not None
    with_token = f'server: {{grpc: "{bind}", token: "${{LLM_HEALTH_TOKEN}}"}}\n'
    config = parse_config(with_token + BASE, "x.yaml", {"LLM_HEALTH_TOKEN": TOKEN})
    assert config.server.token is not None and config.server.token.get_secret_value() == TOKEN
    assert TOKEN not in repr(config) and TOKEN not in str(config.model_dump())
    assert TOKEN in config.secret_values()


@pytest.mark.parametrize("bind", ["127.0.0.1:18000", "localhost:18000", "[::1]:18000", "unix:/x"])
def test_loopback_and_unix_sockets_need_nothing(bind: str) -> None:
    assert parse_config(f'server: {{grpc: "{bind}"}}\n' + BASE, "x.yaml", {}).server.token is None


def test_token_rules_and_missing_tls_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config('server: {token: "short"}\n' + BASE, "x.yaml", {})
    assert "16 characters" in caught.value.messages[0]
    with pytest.raises(ConfigError) as caught:
        parse_config('server: {token: "has a space in it, 123"}\n' + BASE, "x.yaml", {})
    assert "without spaces" in caught.value.messages[0]
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConfigError) as caught:
        tls = f'server: {{tls: {{cert: "{missing}", key: "{missing}"}}}}\n'
        parse_config(tls + BASE, "x.yaml", {})
    assert "server.tls.cert" in "\n".join(caught.value.messages)
