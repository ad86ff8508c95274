"""``make demo-vllm``'s pure parts: the plugin configuration it writes is one ``serve``
loads (the demo's probe settings, the known-answer check off for random weights), the
share of user traffic read from Envoy's per-host counters, the state log behind its
events and summary, the EngineCore found among a process's children by its title, and
the nice of a server in a session of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_health.config.loader import load_config
from llm_health.demo.engine import children, engine_core, process_name
from llm_health.demo.show import Frame, Shares, StateLog, Timeline, envoy_requests, render
from llm_health.demo.stage import Stage
from llm_health.demo.vllm import PROBE, VLLM_HEADER, VllmCast


def cast_on_ports(tmp_path: Path) -> VllmCast:
    cast = VllmCast(Timeline(), tmp_path / "venv", tmp_path / "model")
    for port, server in zip((18001, 18002, 18003), cast.servers, strict=True):
        server.port = port
    return cast


def test_the_plugin_configuration_loads_with_the_demo_probe_settings(tmp_path: Path) -> None:
    stage = Stage(tmp_path / "envoy.yaml", Timeline(), cast_on_ports(tmp_path), tmp_path)
    stage.grpc_port, stage.http_port = 18010, 18011
    config = load_config(stage.plugin_config())
    (cluster,) = config.clusters
    assert [e.address for e in cluster.endpoints] == [
        "127.0.0.1:18001",
        "127.0.0.1:18002",
        "127.0.0.1:18003",
    ]
    probe = config.probe_for(cluster)
    assert (probe.interval, probe.timeout, probe.healthy_ttft) == (1.0, 2.0, 1.0)
    assert PROBE == {"interval": "1s", "timeout": "2s", "healthy_ttft": "1s"}
    assert probe.api == "openai-chat" and probe.model == "tiny-llama"
    assert probe.verify is not None and not probe.verify.enabled


def test_the_title_says_the_probe_settings_and_the_timeline(tmp_path: Path) -> None:
    cast = VllmCast(Timeline(break_at=30, heal_at=60, end_at=90), tmp_path, tmp_path)
    title = cast.title(12.0)
    for said in ("t=  12s / 90s", "vllm-b frozen at 30s, thawed at 60s", "vllm-c: 12 users"):
        assert said in title
    assert "every 1s, timeout 2s, healthy TTFT < 1s" in title


def test_envoy_counts_each_host_by_its_port() -> None:
    def host(port: int, total: int) -> dict[str, object]:
        return {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "stats": [{"name": "cx_total", "value": 99}, {"name": "rq_total", "value": total}],
        }

    clusters = {"cluster_statuses": [{"host_statuses": [host(18001, 7), host(18002, 0)]}]}
    assert envoy_requests(clusters, 18001) == 7
    assert envoy_requests(clusters, 18002) == 0
    assert envoy_requests(clusters, 18003) == 0  # not in Envoy yet
    assert envoy_requests({}, 18001) == 0


def test_shares_are_of_the_recent_requests_only() -> None:
    shares = Shares()
    assert shares.update(0.0, {"a": 0, "b": 0}) == {"a": 0.0, "b": 0.0}
    assert shares.update(1.0, {"a": 30, "b": 10}) == {"a": 0.75, "b": 0.25}
    assert shares.update(4.0, {"a": 30, "b": 20}) == {"a": 0.6, "b": 0.4}
    # b took every request since t=2: a's older ones are out of the window.
    assert shares.update(7.0, {"a": 30, "b": 30}) == {"a": 0.0, "b": 1.0}


def test_the_state_log_reports_changes_and_time_in_each_state() -> None:
    log = StateLog()
    assert not log.sample("vllm-b", "HEALTHY", 0.0)  # the first sample is no change
    assert not log.sample("vllm-b", "HEALTHY", 10.0)
    assert log.sample("vllm-b", "UNHEALTHY", 12.5)
    assert not log.sample("vllm-b", "UNHEALTHY", 20.0)
    assert log.sample("vllm-b", "HEALTHY", 30.0)
    assert log.summary("vllm-b") == "HEALTHY 12 s, UNHEALTHY 18 s"
    assert log.summary("vllm-c") == "-"


def test_the_table_has_the_servers_own_health_column() -> None:
    row = ["vllm-b", "frozen", "UNHEALTHY", "0", "UNHEALTHY w=1", "200", "-", "timeout",
           "  0.0 %", "2 consecutive timeouts"]  # fmt: skip
    lines = render(Frame("title", [VLLM_HEADER, row], ["t=  30s  frozen"], (3, 2, 1)), None)
    at = lines[2].index("own /health")
    assert lines[3][at:].startswith("200 ")
    assert lines[-1] == "t=  30s  frozen"


def test_the_engine_core_is_the_child_titled_so() -> None:
    # The title is put together at run time: a child forked but not yet exec'd shows its
    # parent's command line, which must not already say it.
    script = (
        "import subprocess, sys\n"
        "title = 'VLLM::Engine' + 'Core'\n"
        "a = subprocess.Popen(['sleep', '30'])\n"
        "b = subprocess.Popen([title, '30'], executable='sleep')\n"
        "print(b.pid, flush=True)\n"
        "sys.stdin.read()\n"
        "a.kill(); b.kill()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        core = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            names = sorted(process_name(pid) for pid in children(parent.pid))
            if names == ["VLLM::EngineCore 30", "sleep 30"]:
                break
            time.sleep(0.05)
        assert names == ["VLLM::EngineCore 30", "sleep 30"]
        assert engine_core(parent.pid) == core
    finally:
        parent.communicate(b"", timeout=10)


def test_a_niced_server_in_a_session_of_its_own_is_niced_as_a_group(tmp_path: Path) -> None:
    """Where the kernel schedules by session (autogroup), a server started in a session of
    its own competes with serve and Envoy at its session's nice, not its process's: the
    demo sets both."""
    group_file = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if not group_file.exists() or group_file.read_text().strip() != "1":
        pytest.skip("the kernel does not group scheduling by session here")
    stage = Stage(tmp_path / "envoy.yaml", Timeline(), cast_on_ports(tmp_path), tmp_path)
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    process = stage.spawn("sleeper", sleeper, own_group=True, nice=10)
    try:
        assert Path(f"/proc/{process.pid}/autogroup").read_text().split()[-1] == "10"
        # nice adds to this process's own (make test runs it at 10; 19 is the most there is)
        want = min(os.getpriority(os.PRIO_PROCESS, 0) + 10, 19)
        assert os.getpriority(os.PRIO_PROCESS, process.pid) == want
    finally:
        process.kill()
        process.wait()
