"""The gateway pod of deploy/kubernetes, run for real on loopback: the Envoy bootstrap
and the llm-health config exactly as the ConfigMaps carry them (only ports and backend
addresses changed for the test), Envoy started with the Deployment's own arguments.

- ``envoy --mode validate`` accepts the ConfigMap bootstrap with the Deployment's exact
  arguments (and rejects a broken bootstrap: the check can fail);
- the real Envoy learns a simulated backend from the real plugin over xDS, HEALTHY with
  weight 100, routes a user request to it, and identifies itself with the pod name
  given by ``--service-node $(POD_NAME)``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import arg_after, configmap_file, container
from tests.envoy_harness import (
    EnvoyProcess,
    envoy_binary,
    host_view,
    http_request,
    render_config,
)
from tests.ports import free_port
from tests.processes import PluginProcess, SimProcess

pytestmark = pytest.mark.envoy
POD_NAME = "llm-gateway-5d8c7b9f4-x2x7q"


def mounted(who: str, flag: str) -> str:
    path = PurePosixPath(arg_after(container(who)["args"], flag))
    return configmap_file(str(path.parent), path.name, who)


def envoy_args(config_path: Path) -> list[str]:
    """The Deployment's Envoy arguments, as the kubelet would expand them."""
    args = [a.replace("$(POD_NAME)", POD_NAME) for a in container("envoy")["args"]]
    args[args.index("-c") + 1] = str(config_path)
    return args


def validate(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [envoy_binary(), *args, "--mode", "validate"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_envoy_accepts_the_configmap_bootstrap_with_the_deployment_args(tmp_path: Path) -> None:
    assert container("envoy")["command"] == ["envoy"]
    bootstrap = tmp_path / "envoy.yaml"
    bootstrap.write_text(mounted("envoy", "-c"))
    result = validate(envoy_args(bootstrap))
    assert result.returncode == 0, result.stdout + result.stderr
    # the same check fails for a bootstrap whose xDS cluster is missing
    broken = yaml.safe_load(bootstrap.read_text())
    broken["static_resources"]["clusters"] = [
        c for c in broken["static_resources"]["clusters"] if c["name"] != "llm_health_xds"
    ]
    bad = tmp_path / "broken.yaml"
    bad.write_text(yaml.safe_dump(broken))
    assert validate(envoy_args(bad)).returncode != 0


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Any]]:
    processes: list[Any] = []
    yield processes
    for process in reversed(processes):
        process.stop()


def test_the_pod_configs_work_together_against_a_real_envoy(
    tmp_path: Path, started: list[Any]
) -> None:
    sim = SimProcess(tmp_path, "gpu", "--ttft", "20ms", "--tpot", "2ms")
    started.append(sim)
    sim.wait_up()
    settings = yaml.safe_load(mounted("llm-health", "--config"))
    for cluster in settings["clusters"]:
        cluster["endpoints"] = [{"address": sim.address}]
        cluster["model"] = "sim-model"
    plugin = PluginProcess(tmp_path / "plugin", settings)  # server: test ports on loopback
    started.append(plugin.start())
    plugin.wait_ready()

    (tmp_path / "configmap-envoy.yaml").write_text(mounted("envoy", "-c"))
    listener_port = free_port()
    rendered = render_config(
        tmp_path / "configmap-envoy.yaml",
        tmp_path / "envoy.yaml",
        xds_port=plugin.grpc_port,
        listener_port=listener_port,
        admin_port=0,
    )
    # The harness passes -c, --log-level and --disable-hot-restart itself; the rest of
    # the Deployment's arguments are added as they are.
    args = envoy_args(rendered)
    extra = ["--service-node", arg_after(args, "--service-node")]
    assert set(args) - set(extra) == {
        "-c", str(rendered), "--disable-hot-restart", "--log-level", "info",
    }  # fmt: skip
    envoy = EnvoyProcess(rendered, workdir=tmp_path / "envoy", extra_args=extra)
    started.append(envoy)
    envoy.start()

    hosts = envoy.wait_until(
        lambda: envoy.host_statuses("llama-70b") or None, 20.0, "EDS from the plugin"
    )
    assert host_view(hosts) == {sim.address: ("HEALTHY", 100)}
    body = json.dumps({"model": "sim-model", "prompt": "hi", "max_tokens": 1}).encode()
    status, _ = http_request(
        f"http://127.0.0.1:{listener_port}/v1/completions",
        method="POST",
        headers={"Content-Type": "application/json"},
        data=body,
    )
    assert status == 200
    assert sim.user_requests() >= 1
    server_info = json.loads(envoy.admin_get("/server_info"))
    assert server_info["node"]["id"] == POD_NAME
    assert server_info["node"]["cluster"] == "llm-gateway"
