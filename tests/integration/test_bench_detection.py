"""The detection benchmark's building blocks (bench/detection.py), so it keeps measuring
what it claims when the shipped configs or the simulator change.

- the five Envoy configs it derives from ``sidecar-ads.yaml`` pass ``envoy --mode
  validate``;
- against a real Envoy 1.40, the "Envoy HC POST 1-token" method really sends its body: the
  simulator sees well-formed 1-token completions marked as probes, the host turns healthy,
  and a CUDA error takes it out;
- against a real Envoy 1.40, the metrics-only picker: Envoy's check reaches its judge for
  the right backend, a saturated /metrics takes the host out and a normal one puts it back;
- the pure parts on fixed input: the picker's rule (queue / KV cache / staleness -> in or
  out) and its /metrics parsing, what counts as hurt when the faulty backend answers on
  time, the analysis (isolation gap, Envoy view changes, access-log parsing).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.envoy_harness import EnvoyProcess, render_config, validate_config
from tests.ports import free_port
from tests.processes import SimProcess

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import detection  # noqa: E402

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(60)]


def render(
    tmp_path: Path, method: str, ports: list[int], chat: bool = False, judge_port: int = 0
) -> Path:
    def edit(config: dict[str, Any]) -> None:
        detection.set_access_log(config, tmp_path / "access.log", method == "llm-health")
        if method != "llm-health":
            detection.make_static(config, ports, method, chat, judge_port or free_port())

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
    checked = method.startswith("hc-") or method == "metrics-only"
    assert ("health_checks" in text) == checked
    assert ("health_check_config" in text) == (method == "metrics-only")
    assert ("outlier_detection" in text) == (method == "outlier")
    assert ("ads_config" in text) == (method == "llm-health")
    # The shipped access-log stream to the plugin stays only where a plugin serves it.
    assert (detection.GRPC_LOGGER in text) == (method == "llm-health")
    assert "envoy.access_loggers.file" in text and "access_loggers.stdout" not in text


def test_metrics_only_needs_a_judge_port() -> None:
    with pytest.raises(ValueError, match="judge port"):
        config = {"static_resources": {"clusters": [{"name": detection.CLUSTER}]}}
        detection.make_static(config, [1], "metrics-only", False)


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


def test_metrics_only_picker_drives_envoy(tmp_path: Path) -> None:
    """The whole metrics-only path: scraper -> judge -> Envoy's 100 ms check -> host out
    while /metrics says 12 waiting, back in when it no longer does."""
    sim = SimProcess(tmp_path, "picked", "--ttft", "20ms")
    picker = detection.Picker([sim.port])
    envoy = None
    try:
        sim.wait_up()
        judge = picker.start()
        path = render(tmp_path, "metrics-only", [sim.port], judge_port=judge)
        envoy = EnvoyProcess(path, workdir=tmp_path / "envoy")
        envoy.start()
        envoy.wait_until(lambda: _host(envoy, sim.address) == (True, 1), 10, "host in")
        sim.set_fault(metrics_waiting=12)
        out = time.monotonic()
        envoy.wait_until(lambda: _host(envoy, sim.address)[0] is False, 5, "saturated out")
        assert time.monotonic() - out < 2.0
        sim.set_fault(metrics_waiting=None)
        envoy.wait_until(lambda: _host(envoy, sim.address)[0] is True, 5, "back in")
    finally:
        if envoy is not None:
            envoy.stop()
        picker.stop()
        sim.stop()
    state = picker.backends[0]
    assert state.checks >= 3 and state.changes == 2, picker.sanity()
    assert state.scrapes > state.failures >= 0


@pytest.mark.parametrize(
    ("queue", "kv", "since", "want"),
    [
        (0.0, 0.0, 0.0, True),  # idle, fresh
        (4.0, 0.79, 0.199, True),  # just under every limit
        (5.0, 0.0, 0.0, False),  # queue at the threshold
        (12.0, 0.1, 0.05, False),  # saturated queue
        (0.0, 0.8, 0.05, False),  # KV cache at the threshold
        (0.0, 0.97, 0.05, False),
        (0.0, 0.0, 0.2, False),  # stale: no successful scrape for 200 ms
        (0.0, 0.0, 3.0, False),
        (0.0, 0.0, None, False),  # never scraped
        (None, None, 0.01, False),  # no queue figure: not judged usable
        (1.0, None, 0.05, True),  # no KV figure (e.g. TGI): judged on the queue alone
        (12.0, 0.97, 1.0, False),  # everything at once
    ],
)
def test_picker_rule(
    queue: float | None, kv: float | None, since: float | None, want: bool
) -> None:
    assert detection.picker_in(queue, kv, since) is want


def test_picker_metrics_parsing() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_waiting Requests waiting.",
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{model_name="m",engine="0"} 3.0',
            'vllm:num_requests_waiting{model_name="m",engine="1"} 4.0',
            'vllm:num_requests_running{model_name="m"} 9.0',
            'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25',
            'vllm:kv_cache_usage_perc{model_name="m",engine="1"} 0.5',
            "vllm:num_requests_waiting_total 100.0",  # another name, same prefix
        ]
    )
    assert detection.picker_metrics(text) == (7.0, 0.5)
    assert detection.picker_metrics("vllm:num_requests_waiting 0\n") == (0.0, None)
    assert detection.picker_metrics(
        "vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.9"
    ) == (
        1.0,
        0.9,
    )
    for bad in ("", "{{{ junk", "vllm:num_requests_waiting NaN", "vllm:kv_cache_usage_perc 0.1"):
        with pytest.raises(ValueError):
            detection.picker_metrics(bad)


def test_served_hurt_and_garbage_answers() -> None:
    R = detection.Request
    window = [
        R("m-1", 10.0, "ok", 0.09),  # served by the faulty backend: hurt
        R("m-2", 10.1, "ok", 0.09),  # served elsewhere: fine
        R("m-3", 10.2, "failed", 0.01),  # counted as failed already, not twice
        R("m-4", 10.3, "stalled", None),
    ]
    hit = {"m-1": 10.0, "m-3": 10.2, "m-4": 10.3}
    assert detection.served_hurt(window, hit) == 1
    garbage = {"choices": [{"text": "!!!!!!!!"}]}
    fine = {"choices": [{"text": " Paris is a city!"}]}
    assert detection.is_garbage(json.dumps(garbage).encode())
    assert not detection.is_garbage(json.dumps(fine).encode())
    assert not detection.is_garbage(b'{"choices": [{"text": "  "}]}')
    assert not detection.is_garbage(b"not json")


def test_new_scenarios_and_heal() -> None:
    scs = {s.name: s for s in detection.scenarios(12)}
    assert {"garbage", "wrong-model", "saturated"} <= set(scs)
    assert all(scs[n].served_hurts for n in ("garbage", "wrong-model", "saturated"))
    assert not any(
        s.served_hurts for n, s in scs.items() if n not in ("garbage", "wrong-model", "saturated")
    )
    # The heal undoes every knob a scenario sets.
    for sc in scs.values():
        assert set(sc.fault or {}) <= set(detection.HEAL), sc.name


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
    assert detection.isolation(routed, 100.0, removed_at) == want


def test_removal_and_readmission() -> None:
    a = "127.0.0.1:1"
    stack = detection.Stack("outlier", [], Path())
    stack.sims = [type("S", (), {"address": a})()]  # type: ignore[list-item]
    stack.views = [(t, {a: (t < 3 or t > 5, 1)}) for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)]
    assert detection.removal(stack, 1.5, 7.0) == (3.0, True)
    assert detection.removal(stack, 1.5, 5.5) == (3.0, False)
    assert detection.removal(stack, 6.0, 9.0) == (None, False)


def test_view_changes_and_timeline() -> None:
    a, b = "127.0.0.1:1", "127.0.0.1:2"
    views = [
        (1.0, {a: (True, 100), b: (True, 100)}),
        (2.0, {a: (True, 30), b: (True, 100)}),
        (3.0, {a: (False, 100), b: (True, 100)}),
        (4.0, {a: (False, 100), b: (True, 100)}),
        (5.0, {a: (True, 100), b: (True, 100)}),
    ]
    assert detection.view_changes(views) == 3
    assert detection.view_changes(views, only=b) == 0
    stack = detection.Stack("llm-health", [], Path())
    stack.views = views
    stack.sims = [type("S", (), {"address": a})()]  # type: ignore[list-item]
    assert detection.envoy_timeline(stack, 1.5, 4.5) == (2.0, 5.0)


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
