"""The detection benchmark's building blocks (bench/detection.py), so it keeps measuring
what it claims when the shipped configs or the simulator change.

- the four Envoy configs it derives from ``sidecar-ads.yaml`` pass ``envoy --mode
  validate``;
- against a real Envoy 1.40, the "Envoy HC POST 1-token" method really sends its body: the
  simulator sees well-formed 1-token completions marked as probes, the host turns healthy,
  and a CUDA error takes it out;
- the pure analysis (isolation gap, Envoy view changes, access-log parsing) on fixed input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.envoy_harness import EnvoyProcess, free_port, render_config, validate_config
from tests.processes import SimProcess

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import detection  # noqa: E402

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(60)]


def render(tmp_path: Path, method: str, ports: list[int], chat: bool = False) -> Path:
    def edit(config: dict[str, Any]) -> None:
        detection.set_access_log(config, tmp_path / "access.log")
        if method != "llm-health":
            detection.make_static(config, ports, method, chat)

    return render_config(
        detection.SHIPPED,
        tmp_path / f"{method}.yaml",
        xds_port=free_port(),
        listener_port=free_port(),
        admin_port=0,
        extra=edit,
    )


@pytest.mark.parametrize("method", sorted(detection.METHODS))
def test_method_configs_validate(tmp_path: Path, method: str) -> None:
    path = render(tmp_path, method, [free_port() for _ in range(3)], chat=method == "hc-post")
    result = validate_config(path)
    assert result.returncode == 0, result.stdout
    text = path.read_text()
    assert ("health_checks" in text) == method.startswith("hc-")
    assert ("outlier_detection" in text) == (method == "outlier")
    assert ("ads_config" in text) == (method == "llm-health")


def _host(envoy: EnvoyProcess, address: str) -> tuple[bool, int]:
    return detection.host_view(envoy.clusters_json())[address]


def test_post_health_check_sends_a_completion(tmp_path: Path) -> None:
    sim = SimProcess(tmp_path, "hc", "--ttft", "20ms")
    envoy = None
    try:
        sim.wait_up()
        envoy = EnvoyProcess(render(tmp_path, "hc-post", [sim.port]), workdir=tmp_path / "envoy")
        envoy.start()
        envoy.wait_until(
            lambda: _host(envoy, sim.address) == (True, 1), 10, "host healthy by POST check"
        )
        stats = sim.stats()
        assert stats["probe_requests"] >= 1 and stats["bad_requests"] == 0, stats
        last = stats["last_request"]
        assert (last["path"], last["max_tokens"], last["stream"]) == ("/v1/completions", 1, False)
        assert last["prompt"] == "hi" and last["probe"] is True
        sim.set_fault(fault="cuda_error")
        envoy.wait_until(
            lambda: _host(envoy, sim.address)[0] is False, 10, "CUDA error to fail the check"
        )
    finally:
        if envoy is not None:
            envoy.stop()
        sim.stop()


@pytest.mark.parametrize(
    ("routed", "removed_at", "want"),
    [
        ([100.5, 101.0, 104.0], None, None),  # Envoy never took it out: not isolated
        ([], 103.0, 100.0),  # none routed there after the fault
        ([100.5, 101.0, 102.95, 109.0], 102.9, 102.95),  # within one poll of the removal
        ([100.5, 101.0, 104.0], 102.0, 101.0),  # routed again after a re-admission
    ],
)
def test_isolation(routed: list[float], removed_at: float | None, want: float | None) -> None:
    assert detection._isolation(routed, 100.0, removed_at) == want


def test_removal_and_readmission() -> None:
    a = "127.0.0.1:1"
    stack = detection.Stack("outlier", [], Path())
    stack.sims = [type("S", (), {"address": a})()]  # type: ignore[list-item]
    stack.views = [(t, {a: (t < 3 or t > 5, 1)}) for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)]
    assert detection._removal(stack, 1.5, 7.0) == (3.0, True)
    assert detection._removal(stack, 1.5, 5.5) == (3.0, False)
    assert detection._removal(stack, 6.0, 9.0) == (None, False)


def test_view_changes_and_timeline() -> None:
    a, b = "127.0.0.1:1", "127.0.0.1:2"
    views = [
        (1.0, {a: (True, 100), b: (True, 100)}),
        (2.0, {a: (True, 30), b: (True, 100)}),
        (3.0, {a: (False, 100), b: (True, 100)}),
        (4.0, {a: (False, 100), b: (True, 100)}),
        (5.0, {a: (True, 100), b: (True, 100)}),
    ]
    assert detection._changes(views) == 3
    assert detection._changes(views, only=b) == 0
    stack = detection.Stack("llm-health", [], Path())
    stack.views = views
    stack.sims = [type("S", (), {"address": a})()]  # type: ignore[list-item]
    assert detection._envoy_timeline(stack, 1.5, 4.5) == (2.0, 5.0)


def test_access_log_and_host_view(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    lines = [
        {"start": "10.500", "host": "127.0.0.1:9", "code": 200, "attempts": 1, "id": "x-1"},
        {"start": "10.600", "host": "-", "code": 503, "attempts": "-", "id": "x-2"},
    ]
    log.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n")
    routed = detection.read_access_log(log)
    assert routed["x-1"] == detection.Routed(10.5, "127.0.0.1:9", 1)
    assert routed["x-2"].host == "-" and routed["x-2"].attempts == 0
    clusters = {
        "cluster_statuses": [
            {
                "name": detection.CLUSTER,
                "host_statuses": [
                    {
                        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 1}},
                        "health_status": {"eds_health_status": "HEALTHY"},
                        "weight": 30,
                    },
                    {
                        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 2}},
                        "health_status": {"failed_outlier_check": True},
                        "weight": 1,
                    },
                ],
            }
        ]
    }
    assert detection.host_view(clusters) == {"127.0.0.1:1": (True, 30), "127.0.0.1:2": (False, 1)}
