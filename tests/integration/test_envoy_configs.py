"""The shipped Envoy bootstraps (envoy-configs/*.yaml) against a real Envoy 1.40.

- every shipped file renders with test ports and passes ``envoy --mode validate``, and a
  deliberately broken render fails it (the check can fail);
- the settings docs/design.md §4 demands are set, to the intended values, and commented;
- the harness starts a real Envoy, reads its admin API and always stops it;
- with a minimal in-test xDS server (state-of-the-world ADS, standalone EDS, delta ADS):
  Envoy takes health status and weight from EDS, NACKs a weight of 0 and keeps its last
  accepted endpoints, keeps them when the xDS server goes away, and with
  healthy_panic_threshold 0 answers 503 "no healthy upstream" instead of trying dead hosts.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc
from envoy.service.health.v3 import hds_pb2, hds_pb2_grpc
from envoy.service.runtime.v3 import rtds_pb2, rtds_pb2_grpc
from google.protobuf import any_pb2

from tests.envoy_harness import (
    CLUSTER_ROUTE_HEADER,
    DEFAULT_EDS_CLUSTER,
    WEIGHT_HONOURING_LB_POLICIES,
    XDS_CLUSTER,
    EnvoyError,
    EnvoyProcess,
    eds_clusters,
    envoy_version,
    grpc_cluster_names,
    http_request,
    listeners,
    load_config,
    render_config,
    routes,
    shipped_configs,
    static_clusters,
    validate_config,
)
from tests.polling import wait_until, wait_until_async
from tests.ports import free_port

pytestmark = pytest.mark.envoy

SHIPPED = shipped_configs()
SHIPPED_IDS = [p.name for p in SHIPPED]
CLA_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
RTDS_TYPE = "type.googleapis.com/envoy.service.runtime.v3.Runtime"


def test_envoy_is_the_pinned_version() -> None:
    """The behaviour these tests (and the comments in envoy-configs/) rely on was
    checked on Envoy 1.40; a different binary would make them lie."""
    assert envoy_version().startswith("1.40."), envoy_version()


def test_the_expected_configs_are_shipped() -> None:
    names = {p.name for p in SHIPPED}
    assert {"sidecar-ads.yaml", "eds-standalone.yaml", "delta-ads.yaml"} <= names


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def make_envoy(tmp_path: Path) -> Iterator[Callable[..., EnvoyProcess]]:
    """Factory for EnvoyProcess objects that are all stopped at teardown, pass or fail.
    Their logs stay in pytest's tmp_path."""
    made: list[EnvoyProcess] = []

    def make(config: Path, **kwargs: Any) -> EnvoyProcess:
        envoy = EnvoyProcess(config, workdir=tmp_path / f"envoy-{len(made)}", **kwargs)
        made.append(envoy)
        return envoy

    yield make
    for envoy in made:
        envoy.stop()


def render(src: Path, tmp_path: Path, name: str = "envoy.yaml", **kwargs: Any) -> Path:
    kwargs.setdefault("xds_port", free_port())
    kwargs.setdefault("listener_port", free_port())
    kwargs.setdefault("admin_port", 0)
    return render_config(src, tmp_path / name, **kwargs)


def assert_valid(path: Path) -> None:
    result = validate_config(path)
    assert result.returncode == 0, f"envoy --mode validate failed for {path}:\n{result.stdout}"


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("src", SHIPPED, ids=SHIPPED_IDS)
def test_shipped_file_validates_as_is_without_warnings(src: Path) -> None:
    """Also no warning: Envoy only warns about, e.g., unknown retry_on tokens or
    deprecated fields, and still says OK."""
    result = validate_config(src)
    assert result.returncode == 0, result.stdout
    assert "warning" not in result.stdout.lower(), result.stdout


@pytest.mark.parametrize("src", SHIPPED, ids=SHIPPED_IDS)
def test_rendered_config_validates_and_uses_loopback_and_test_ports(
    src: Path, tmp_path: Path
) -> None:
    xds, listener, admin = free_port(), free_port(), free_port()
    out = render_config(
        src, tmp_path / "r.yaml", xds_port=xds, listener_port=listener, admin_port=admin
    )
    assert_valid(out)
    config = load_config(out)
    assert config["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": admin,
    }
    assert listeners(config)[0]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": listener,
    }
    for name in grpc_cluster_names(config):
        (cluster,) = [c for c in static_clusters(config) if c["name"] == name]
        (locality,) = cluster["load_assignment"]["endpoints"]
        (lb_endpoint,) = locality["lb_endpoints"]
        assert lb_endpoint["endpoint"]["address"]["socket_address"] == {
            "address": "127.0.0.1",
            "port_value": xds,
        }


def test_render_several_eds_clusters_with_overrides(tmp_path: Path) -> None:
    src = next(p for p in SHIPPED if p.name == "sidecar-ads.yaml")
    out = render(
        src,
        tmp_path,
        clusters={"qwen-7b": {}, "llama-70b": {"common_lb_config": {"update_merge_window": "1s"}}},
        initial_fetch_timeout="2s",
    )
    assert_valid(out)
    config = load_config(out)
    eds = {c["name"]: c for c in eds_clusters(config)}
    assert list(eds) == ["qwen-7b", "llama-70b"]
    assert eds["llama-70b"]["common_lb_config"]["update_merge_window"] == "1s"
    assert eds["qwen-7b"]["common_lb_config"]["update_merge_window"] == "0s"
    for cluster in eds.values():
        assert cluster["eds_cluster_config"]["eds_config"]["initial_fetch_timeout"] == "2s"
    # Header-selected routes first, then the catch-all goes to the first name.
    targets = [
        (r["route"]["cluster"], [h["string_match"]["exact"] for h in r["match"].get("headers", [])])
        for r in routes(config)
    ]
    assert targets == [("qwen-7b", ["qwen-7b"]), ("llama-70b", ["llama-70b"]), ("qwen-7b", [])]
    assert all(
        h["name"] == CLUSTER_ROUTE_HEADER for r in routes(config)[:2] for h in r["match"]["headers"]
    )
    # A None override deletes the key.
    out2 = render(
        src,
        tmp_path,
        "r2.yaml",
        clusters={"x": {"common_lb_config": {"healthy_panic_threshold": None}}},
    )
    (only,) = eds_clusters(load_config(out2))
    assert "healthy_panic_threshold" not in only["common_lb_config"]
    assert_valid(out2)


def _xds_endpoint(config: dict[str, Any]) -> dict[str, Any]:
    (cluster,) = [c for c in static_clusters(config) if c["name"] == XDS_CLUSTER]
    lb_endpoint: dict[str, Any] = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    return lb_endpoint


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        # Envoy's proto validation: load_balancing_weight must be >= 1 (docs/design.md §4).
        (lambda c: _xds_endpoint(c).update(load_balancing_weight=0), "LoadBalancingWeight"),
        (lambda c: eds_clusters(c)[0].update(no_such_field=1), "no_such_field"),
    ],
    ids=["weight-0-endpoint", "unknown-field"],
)
def test_broken_render_fails_validation(
    tmp_path: Path, breakage: Callable[[dict[str, Any]], None], expected: str
) -> None:
    src = next(p for p in SHIPPED if p.name == "sidecar-ads.yaml")
    out = render(src, tmp_path, extra=breakage)
    result = validate_config(out)
    assert result.returncode != 0, result.stdout
    assert expected in result.stdout, result.stdout


# --------------------------------------------------------------------------- settings


def _comment_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.lstrip().startswith("#")]


@pytest.mark.parametrize("src", SHIPPED, ids=SHIPPED_IDS)
def test_eds_clusters_set_and_comment_the_design_settings(src: Path) -> None:
    config = load_config(src)
    comments = "\n".join(_comment_lines(src))
    for cluster in eds_clusters(config):
        name = cluster["name"]
        lb = cluster.get("common_lb_config", {})
        assert lb.get("update_merge_window") == "0s", name
        assert lb.get("healthy_panic_threshold") == {"value": 0}, name
        assert cluster.get("lb_policy", "ROUND_ROBIN") in WEIGHT_HONOURING_LB_POLICIES, name
        eds_config = cluster["eds_cluster_config"]["eds_config"]
        assert "initial_fetch_timeout" in eds_config, name
        assert eds_config["resource_api_version"] == "V3", name
        assert "health_checks" not in cluster and "outlier_detection" not in cluster, name
    if eds_clusters(config):
        for key in ("update_merge_window", "healthy_panic_threshold", "initial_fetch_timeout"):
            assert key in comments, f"{src.name}: no comment explains {key}"


@pytest.mark.parametrize("src", SHIPPED, ids=SHIPPED_IDS)
def test_routes_suit_long_llm_streams_and_never_replay_a_prompt(src: Path) -> None:
    config = load_config(src)
    eds_names = {c["name"] for c in eds_clusters(config)}
    llm_routes = [r for r in routes(config) if r["route"].get("cluster") in eds_names]
    assert llm_routes, "no route to an EDS cluster"
    for route in llm_routes:
        action = route["route"]
        assert action["timeout"] == "0s"  # no total timeout on a streamed answer
        assert action["idle_timeout"]  # ... but a hung stream is freed
        retry_on = set(action.get("retry_policy", {}).get("retry_on", "").split(","))
        assert not retry_on & {"5xx", "reset", "gateway-error", "retriable-4xx"}, retry_on


@pytest.mark.parametrize("src", SHIPPED, ids=SHIPPED_IDS)
def test_shipped_defaults(src: Path) -> None:
    """The defaults users get: admin 127.0.0.1:9901, listener :10000, plugin
    127.0.0.1:18000 over HTTP/2, cluster llama-70b, node gateway-1/llm-gateway."""
    config = load_config(src)
    assert config["node"] == {"id": "gateway-1", "cluster": "llm-gateway"}
    assert config["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 9901,
    }
    assert listeners(config)[0]["address"]["socket_address"]["port_value"] == 10000
    assert DEFAULT_EDS_CLUSTER in {c["name"] for c in eds_clusters(config)}
    assert grpc_cluster_names(config) == {XDS_CLUSTER}
    xds = _xds_endpoint(config)
    assert xds["endpoint"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 18000,
    }
    (xds_cluster,) = [c for c in static_clusters(config) if c["name"] == XDS_CLUSTER]
    options = xds_cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert "http2_protocol_options" in options["explicit_http_config"]
    api_sources = [config.get("dynamic_resources", {}).get("ads_config")] + [
        c["eds_cluster_config"]["eds_config"].get("api_config_source") for c in eds_clusters(config)
    ]
    for source in filter(None, api_sources):
        assert source["transport_api_version"] == "V3"
        assert source["set_node_on_first_message_only"] is True


# --------------------------------------------------------------------------- harness smoke


def test_envoy_goes_live_without_xds_server_after_initial_fetch_timeout(
    tmp_path: Path, make_envoy: Callable[..., EnvoyProcess]
) -> None:
    """Nothing listens on the xDS port. Envoy 1.40 stays PRE_INITIALIZING (``/ready``
    503) until the EDS cluster's initial_fetch_timeout, then goes LIVE with the cluster
    empty: with the shipped 10 s a gateway whose plugin is down starts 10 s late."""
    src = next(p for p in SHIPPED if p.name == "sidecar-ads.yaml")
    listener = free_port()
    config = render(src, tmp_path, listener_port=listener, initial_fetch_timeout="2s")
    envoy = make_envoy(config)
    started = time.monotonic()
    envoy.start(wait_live=False)
    status, body = envoy.admin_request("/ready")
    if status != 200:  # normally: the timeout cannot have fired yet
        assert (status, body.strip()) == (503, "PRE_INITIALIZING")
    envoy.wait_live()
    assert time.monotonic() - started >= 2.0
    assert envoy.server_state() == "LIVE"
    assert envoy.stat("cluster.llama-70b.init_fetch_timeout") == 1
    assert envoy.stat("cluster.llama-70b.update_success") == 0
    assert envoy.stat("control_plane.connected_state") == 0
    assert DEFAULT_EDS_CLUSTER in envoy.cluster_names()
    assert envoy.host_statuses(DEFAULT_EDS_CLUSTER) == {}
    with pytest.raises(KeyError):
        envoy.host_statuses("no-such-cluster")
    # The listener (rendered to 127.0.0.1:<listener>) serves, with nothing to route to.
    assert http_request(f"http://127.0.0.1:{listener}/v1/models") == (503, "no healthy upstream")

    pid = envoy.pid
    assert pid is not None
    assert envoy.stop() == 0  # SIGTERM: clean exit
    assert not envoy.running
    with pytest.raises(ProcessLookupError):  # gone and reaped
        os.kill(pid, 0)
    assert envoy.stop() == 0  # idempotent


def test_two_envoys_run_side_by_side(
    tmp_path: Path, make_envoy: Callable[..., EnvoyProcess]
) -> None:
    src = next(p for p in SHIPPED if p.name == "sidecar-ads.yaml")
    first = make_envoy(render(src, tmp_path, "a.yaml", initial_fetch_timeout="0.5s"))
    second = make_envoy(render(src, tmp_path, "b.yaml", initial_fetch_timeout="0.5s"))
    first.start(wait_live=False)
    second.start(wait_live=False)
    first.wait_live()
    second.wait_live()
    assert first.admin_address != second.admin_address
    assert first.is_live() and second.is_live()


async def test_async_start_keeps_the_event_loop_running(tmp_path: Path) -> None:
    """In async tests the plugin's xDS server runs in the same event loop as the test:
    ``astart``/``wait_for_async`` must not block it while Envoy initialises."""
    src = next(p for p in SHIPPED if p.name == "sidecar-ads.yaml")
    config = render(src, tmp_path, initial_fetch_timeout="1s")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        async with EnvoyProcess(config, workdir=tmp_path / "envoy") as envoy:
            assert ticks >= 5  # ~1 s of initial_fetch_timeout passed with the loop free
            state = await envoy.wait_until_async(envoy.server_state, 5, "the server state")
            assert state == "LIVE"
            assert await wait_until_async(lambda: asyncio.sleep(0, result=envoy.pid), 1, "pid")
        assert not envoy.running
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)


def test_start_failure_is_a_clear_error_and_reaps(
    tmp_path: Path, make_envoy: Callable[..., EnvoyProcess]
) -> None:
    src = next(p for p in SHIPPED if p.name == "sidecar-ads.yaml")
    bad = render(src, tmp_path, extra=lambda c: eds_clusters(c)[0].update(no_such_field=1))
    envoy = make_envoy(bad)
    with pytest.raises(EnvoyError, match="no_such_field"):
        envoy.start()
    assert not envoy.running
    assert envoy.returncode not in (None, 0)


# --------------------------------------------------------------------------- with xDS


def _assignment(
    cluster: str, hosts: list[tuple[int, str, int]]
) -> endpoint_pb2.ClusterLoadAssignment:
    """hosts: (port on 127.0.0.1, HealthStatus name, load_balancing_weight)."""
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster)
    locality = cla.endpoints.add()
    for port, health, weight in hosts:
        lb_endpoint = locality.lb_endpoints.add()
        lb_endpoint.endpoint.address.socket_address.address = "127.0.0.1"
        lb_endpoint.endpoint.address.socket_address.port_value = port
        lb_endpoint.health_status = health_check_pb2.HealthStatus.Value(health)
        lb_endpoint.load_balancing_weight.value = weight
    return cla


class FakeXds(
    ads_pb2_grpc.AggregatedDiscoveryServiceServicer,  # type: ignore[misc]
    eds_pb2_grpc.EndpointDiscoveryServiceServicer,  # type: ignore[misc]
    hds_pb2_grpc.HealthDiscoveryServiceServicer,  # type: ignore[misc]
    rtds_pb2_grpc.RuntimeDiscoveryServiceServicer,  # type: ignore[misc]
):
    """The least xDS server that serves fixed ClusterLoadAssignments over
    state-of-the-world ADS, standalone EDS and delta ADS, and records ACKs and NACKs.
    Test scaffolding only: the real server is llm_health.xds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._assignments: dict[str, endpoint_pb2.ClusterLoadAssignment] = {}
        self._version = 0
        self._streams: list[queue.Queue[Any]] = []
        self.nacks: list[str] = []
        self.acked_versions: list[str] = []
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.so_reuseport", 0)]
        )
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(self, self.server)
        eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(self, self.server)
        hds_pb2_grpc.add_HealthDiscoveryServiceServicer_to_server(self, self.server)
        rtds_pb2_grpc.add_RuntimeDiscoveryServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=0).wait(5)

    def publish(self, *assignments: endpoint_pb2.ClusterLoadAssignment) -> None:
        """Replace the assignments of these clusters and push them to open streams."""
        with self._lock:
            for cla in assignments:
                self._assignments[cla.cluster_name] = cla
            self._version += 1
            for stream in self._streams:
                stream.put(("push", None))

    def _snapshot(self, names: set[str] | list[str]) -> tuple[str, list[tuple[str, any_pb2.Any]]]:
        with self._lock:
            out = []
            for name in names:
                if name in self._assignments:
                    packed = any_pb2.Any()
                    packed.Pack(self._assignments[name])
                    out.append((name, packed))
            return str(self._version), out

    def _events(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        """Requests and pushes of one stream, in order, until the stream ends."""
        events: queue.Queue[Any] = queue.Queue()
        with self._lock:
            self._streams.append(events)

        def read() -> None:
            try:
                for request in requests:
                    events.put(("request", request))
            except Exception:  # the stream was cancelled
                pass
            events.put(("end", None))

        threading.Thread(target=read, daemon=True).start()
        try:
            while context.is_active():
                try:
                    kind, request = events.get(timeout=0.1)
                except queue.Empty:
                    continue
                if kind == "end":
                    return
                yield kind, request
        finally:
            with self._lock:
                self._streams.remove(events)

    def _sotw(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        names: list[str] = []
        nonce = 0
        for kind, request in self._events(requests, context):
            if kind == "request":
                if request.HasField("error_detail"):
                    self.nacks.append(request.error_detail.message)
                    continue
                if request.response_nonce:
                    self.acked_versions.append(request.version_info)
                    if list(request.resource_names) == names:
                        continue  # a plain ACK is never answered
                names = list(request.resource_names)
            version, resources = self._snapshot(names)
            nonce += 1
            yield discovery_pb2.DiscoveryResponse(
                version_info=version,
                resources=[packed for _, packed in resources],
                type_url=CLA_TYPE,
                nonce=str(nonce),
            )

    StreamAggregatedResources = _sotw
    StreamEndpoints = _sotw

    def DeltaAggregatedResources(
        self, requests: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        subscribed: set[str] = set()
        nonce = 0
        for kind, request in self._events(requests, context):
            if kind == "request":
                if request.HasField("error_detail"):
                    self.nacks.append(request.error_detail.message)
                    continue
                subscribed |= set(request.resource_names_subscribe)
                subscribed -= set(request.resource_names_unsubscribe)
                if request.response_nonce:
                    self.acked_versions.append(request.response_nonce)
                    if not request.resource_names_subscribe:
                        continue
            version, resources = self._snapshot(subscribed)
            nonce += 1
            yield discovery_pb2.DeltaDiscoveryResponse(
                system_version_info=version,
                resources=[
                    discovery_pb2.Resource(name=name, version=version, resource=packed)
                    for name, packed in resources
                ],
                type_url=CLA_TYPE,
                nonce=str(nonce),
            )

    DeltaEndpoints = DeltaAggregatedResources

    def StreamHealthCheck(
        self, requests: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        """HDS (envoy-configs/hds.yaml): nothing to check, so an empty specifier answers
        each HealthCheckRequest (Envoy logs a warning for a refused HDS stream)."""
        for request in requests:
            if request.HasField("health_check_request"):
                yield hds_pb2.HealthCheckSpecifier()

    def StreamRuntime(
        self, requests: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        """RTDS (envoy-configs/admission-native.yaml): an empty layer for each name asked,
        once (Envoy logs a warning for a refused RTDS stream)."""
        for request in requests:
            if request.response_nonce:
                continue
            resources = []
            for name in request.resource_names:
                packed = any_pb2.Any()
                packed.Pack(rtds_pb2.Runtime(name=name))
                resources.append(packed)
            yield discovery_pb2.DiscoveryResponse(
                version_info="1", resources=resources, type_url=RTDS_TYPE, nonce="1"
            )


@pytest.fixture
def fake_xds() -> Iterator[FakeXds]:
    server = FakeXds()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("src", SHIPPED, ids=SHIPPED_IDS)
def test_envoy_takes_health_and_weight_from_eds_and_keeps_last_good_data(
    src: Path,
    tmp_path: Path,
    fake_xds: FakeXds,
    make_envoy: Callable[..., EnvoyProcess],
) -> None:
    hosts = [(18101, "HEALTHY", 100), (18102, "HEALTHY", 30), (18103, "UNHEALTHY", 100)]
    hosts.append((18104, "DRAINING", 100))
    fake_xds.publish(_assignment(DEFAULT_EDS_CLUSTER, hosts))
    envoy = make_envoy(render(src, tmp_path, xds_port=fake_xds.port))
    envoy.start()  # the first EDS answer arrives before initial_fetch_timeout
    assert "[warning]" not in envoy.log_text(), envoy.log_tail()

    expected = {
        "127.0.0.1:18101": ("HEALTHY", 100),
        "127.0.0.1:18102": ("HEALTHY", 30),
        "127.0.0.1:18103": ("UNHEALTHY", 100),
        "127.0.0.1:18104": ("DRAINING", 100),
    }
    assert envoy.view(DEFAULT_EDS_CLUSTER) == expected
    prefix = f"cluster.{DEFAULT_EDS_CLUSTER}."
    assert envoy.stat(prefix + "update_success") >= 1
    assert envoy.stat(prefix + "update_rejected") == 0
    assert envoy.stat(prefix + "init_fetch_timeout") == 0
    assert envoy.stat(prefix + "membership_healthy") == 2
    assert envoy.stat(prefix + "membership_total") == 4
    assert envoy.xds_connected(DEFAULT_EDS_CLUSTER)
    host = envoy.host_statuses(DEFAULT_EDS_CLUSTER)["127.0.0.1:18103"]
    assert host["health_flags"] == []  # EDS status is not a flag in the JSON
    assert host["priority"] == 0

    # A weight of 0 is NACKed; Envoy keeps the last accepted assignment.
    fake_xds.publish(_assignment(DEFAULT_EDS_CLUSTER, [(18101, "HEALTHY", 0)]))
    envoy.wait_until(lambda: envoy.stat(prefix + "update_rejected") == 1, 10, "the NACK in Envoy")
    wait_until(lambda: fake_xds.nacks, 5, "the NACK at the xDS server")
    assert "LoadBalancingWeight" in fake_xds.nacks[0]
    assert envoy.view(DEFAULT_EDS_CLUSTER) == expected

    # The xDS server goes away: Envoy keeps routing with what it has (docs/design.md §7).
    fake_xds.stop()
    envoy.wait_until(
        lambda: not envoy.xds_connected(DEFAULT_EDS_CLUSTER), 10, "the xDS stream to drop"
    )
    assert envoy.view(DEFAULT_EDS_CLUSTER) == expected


def test_panic_threshold_zero_answers_503_instead_of_trying_dead_hosts(
    tmp_path: Path, fake_xds: FakeXds, make_envoy: Callable[..., EnvoyProcess]
) -> None:
    """Two clusters, every endpoint UNHEALTHY (and nothing listening on them). The
    shipped healthy_panic_threshold 0 gives an immediate 503 "no healthy upstream";
    Envoy's default (50 %) panics and tries the dead hosts anyway."""
    src = next(p for p in SHIPPED if p.name == "sidecar-ads.yaml")
    dead = [(free_port(), "UNHEALTHY", 100), (free_port(), "UNHEALTHY", 100)]
    fake_xds.publish(_assignment("shipped", dead), _assignment("default-panic", dead))
    listener = free_port()
    config = render(
        src,
        tmp_path,
        xds_port=fake_xds.port,
        listener_port=listener,
        clusters={
            "shipped": {},
            "default-panic": {"common_lb_config": {"healthy_panic_threshold": None}},
        },
    )
    envoy = make_envoy(config)
    envoy.start()
    assert len(envoy.host_statuses("shipped")) == len(envoy.host_statuses("default-panic")) == 2

    def call(cluster: str) -> tuple[int, str]:
        return http_request(
            f"http://127.0.0.1:{listener}/v1/completions",
            method="POST",
            data=b'{"prompt": "hi", "max_tokens": 1}',
            headers={CLUSTER_ROUTE_HEADER: cluster, "content-type": "application/json"},
        )

    assert call("shipped") == (503, "no healthy upstream")
    assert envoy.stat("cluster.shipped.lb_healthy_panic", default=0) == 0
    assert envoy.stat("cluster.shipped.upstream_cx_total") == 0  # never tried a dead host

    status, body = call("default-panic")
    assert status == 503 and body != "no healthy upstream", body
    assert envoy.stat("cluster.default-panic.lb_healthy_panic") >= 1
    assert envoy.stat("cluster.default-panic.upstream_cx_connect_fail") >= 1
