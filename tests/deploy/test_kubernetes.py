"""deploy/kubernetes: the manifests validate OFFLINE against the Kubernetes schemas
(``kubernetes-validate`` ships them), and every number and path they share with each
other, with the Dockerfile, with llm-health's config and with Envoy's bootstrap agrees.

The Envoy side against the real binary is in test_kubernetes_envoy.py.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import ValidationError, validate

from llm_health.app.assemble import build_runtime
from llm_health.config import Config, parse_config, split_address
from tests.deploy.manifests import (
    DOCKERFILE,
    KUBERNETES,
    KUSTOMIZATION,
    ROOT,
    all_containers,
    arg_after,
    configmap_file,
    container,
    dockerfile_cmd,
    exposed_ports,
    final_user,
    find,
    load_manifests,
    manifest_files,
    pinned_envoy_version,
    pod_spec,
    port_number,
    pyproject,
)
from tests.envoy_harness import eds_clusters, grpc_cluster_names, listeners, static_clusters

# Oldest supported (native sidecars: 1.29; lifecycle sleep action: 1.30) and newest known.
K8S_VERSIONS = ("1.30", "1.37")
SIDECAR_BOOTSTRAP = ROOT / "envoy-configs" / "sidecar-ads.yaml"


def llm_health_config() -> Config:
    """The ConfigMap's llm-health.yaml, at the path the container's --config names."""
    config_path = PurePosixPath(arg_after(container("llm-health")["args"], "--config"))
    text = configmap_file(str(config_path.parent), config_path.name, "llm-health")
    return parse_config(text, "llm-health-config.yaml", {})


def envoy_bootstrap_text() -> str:
    config_path = PurePosixPath(arg_after(container("envoy")["args"], "-c"))
    return configmap_file(str(config_path.parent), config_path.name, "envoy")


def envoy_bootstrap() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(envoy_bootstrap_text())
    return loaded


# --------------------------------------------------------------------------- schemas


def test_the_expected_manifests_are_shipped() -> None:
    kinds = sorted((path.name, doc["kind"]) for path, doc in load_manifests())
    assert kinds == [
        ("envoy-config.yaml", "ConfigMap"),
        ("gateway.yaml", "Deployment"),
        ("gateway.yaml", "PodDisruptionBudget"),
        ("gateway.yaml", "Service"),
        ("llm-health-config.yaml", "ConfigMap"),
        ("model-servers.yaml", "Service"),
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schema(version: str) -> None:
    """Strict: unknown fields are errors too (a typo such as `readinesProbe` would
    otherwise be dropped silently by the API server)."""
    for path, document in load_manifests():
        try:
            validate(document, version, strict=True)
        except ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{path.name} {document['kind']}: {where}: {exc.message}")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["ports"][0].update(containerPort="18080"), "is not of type 'integer'"),
        (lambda c: c.update(readinesProbe=c["readinessProbe"]), "Additional properties"),
        (lambda c: c["securityContext"].update(runAsNonRoot="yes"), "is not of type 'boolean'"),
    ],
)
def test_the_schema_validation_can_fail(edit: Any, message: str) -> None:
    deployment = copy.deepcopy(find("Deployment"))
    edit(deployment["spec"]["template"]["spec"]["initContainers"][0])
    with pytest.raises(ValidationError) as caught:
        validate(deployment, K8S_VERSIONS[-1], strict=True)
    assert message in caught.value.message


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    assert sorted(kustomization["resources"]) == sorted(p.name for p in manifest_files())
    for name in kustomization["resources"]:
        assert (KUBERNETES / name).is_file()


# --------------------------------------------------------------------------- llm-health


def test_the_mounted_llm_health_config_is_valid() -> None:
    config = llm_health_config()
    assert config.alerts.webhooks == ()  # nothing is sent until the user adds a receiver
    assert [c.name for c in config.clusters] == ["llama-70b"]


def test_discovery_follows_the_headless_service() -> None:
    """The shipped cluster is discovered from the headless Service's DNS name, on its
    port; the Service is headless and publishes booting pods (seen as STARTING)."""
    (discovery,) = llm_health_config().discoveries().values()
    service = next(d for p, d in load_manifests() if p.name == "model-servers.yaml")
    spec = service["spec"]
    meta = service["metadata"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert discovery.kind == "dns"
    assert discovery.name == f"{meta['name']}.{meta['namespace']}.svc.cluster.local"
    assert discovery.port == spec["ports"][0]["port"]


def test_llm_health_runs_the_image_cmd_with_the_mounted_config_path() -> None:
    llm_health = container("llm-health")
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert "command" not in llm_health  # the image's ENTRYPOINT (the console script) runs
    assert llm_health["args"] == dockerfile_cmd(text)
    config_path = arg_after(llm_health["args"], "--config")
    assert config_path == "/etc/llm-health/llm-health.yaml"
    assert {m["mountPath"] for m in llm_health["volumeMounts"]} == {"/etc/llm-health"}


def test_llm_health_is_a_native_sidecar_started_before_envoy() -> None:
    spec = pod_spec()
    assert [c["name"] for c in spec["initContainers"]] == ["llm-health"]
    assert spec["initContainers"][0]["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["containers"]] == ["envoy"]


async def test_probes_hit_the_http_port_and_paths_llm_health_serves() -> None:
    """The paths are checked against the HTTP app ``serve`` really builds from this
    config (the runtime's, not a list kept here)."""
    config = llm_health_config()
    host, http_port = split_address(config.server.http)
    # the kubelet probes the pod IP: a loopback-only HTTP server would fail every probe
    assert not ipaddress.ip_address(host).is_loopback, config.server.http
    llm_health = container("llm-health")
    probes = {
        kind: llm_health[kind] for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    served = {
        resource.canonical for resource in build_runtime(config).http_app().router.resources()
    }
    for kind, probe in probes.items():
        get = probe["httpGet"]
        assert port_number("llm-health", get["port"]) == http_port, kind
        assert get["path"] in served, (kind, get["path"], served)
    assert probes["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probes["startupProbe"]["httpGet"]["path"] == "/readyz"
    # the startup budget covers the warm start (push at the latest after warm_start_timeout)
    startup = probes["startupProbe"]
    budget_s = startup["periodSeconds"] * startup["failureThreshold"]
    assert budget_s >= 4 * config.xds.warm_start_timeout
    assert http_port in exposed_ports(DOCKERFILE.read_text(encoding="utf-8"))
    annotations = find("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(http_port)
    assert annotations["prometheus.io/path"] in served


def test_every_env_reference_in_the_config_is_provided_to_the_container() -> None:
    config_path = PurePosixPath(arg_after(container("llm-health")["args"], "--config"))
    text = configmap_file(str(config_path.parent), config_path.name, "llm-health")
    referenced = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", _uncommented(text)))
    provided = {e["name"] for e in container("llm-health").get("env", [])}
    assert referenced, "expected the example's ${VLLM_API_KEY}"
    assert referenced <= provided, referenced - provided
    for env in container("llm-health")["env"]:
        # secrets come from a Secret, never inline in the manifest
        assert "secretKeyRef" in env.get("valueFrom", {}), env["name"]


# --------------------------------------------------------------------------- Envoy


def test_the_envoy_bootstrap_is_the_shipped_sidecar_config() -> None:
    """An exact copy: what runs in the pod is what the real-Envoy tests exercise."""
    assert envoy_bootstrap_text() == SIDECAR_BOOTSTRAP.read_text(encoding="utf-8"), (
        "deploy/kubernetes/envoy-config.yaml is stale: run python deploy/sync_envoy_configmap.py"
    )


def test_envoy_reaches_llm_health_over_loopback_xds() -> None:
    config, bootstrap = llm_health_config(), envoy_bootstrap()
    grpc_host, grpc_port = split_address(config.server.grpc)
    assert ipaddress.ip_address(grpc_host).is_loopback  # never reachable from outside the pod
    by_name = {c["name"]: c for c in static_clusters(bootstrap)}
    names = grpc_cluster_names(bootstrap)
    assert names == {"llm_health_xds"}
    for name in names:
        endpoints = [
            lb["endpoint"]["address"]["socket_address"]
            for group in by_name[name]["load_assignment"]["endpoints"]
            for lb in group["lb_endpoints"]
        ]
        assert endpoints == [{"address": grpc_host, "port_value": grpc_port}], name


def test_every_envoy_eds_cluster_is_probed_by_llm_health() -> None:
    """An EDS cluster llm-health does not know would start empty after
    initial_fetch_timeout, and stay empty."""
    eds = {c["name"] for c in eds_clusters(envoy_bootstrap())}
    configured = {c.name for c in llm_health_config().clusters}
    assert eds
    assert eds <= configured, eds - configured


def test_envoy_ports_probes_and_service_agree() -> None:
    bootstrap = envoy_bootstrap()
    [listener] = listeners(bootstrap)
    listener_port = listener["address"]["socket_address"]["port_value"]
    envoy = container("envoy")
    assert port_number("envoy", "ingress") == listener_port
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert port_number("envoy", envoy[kind]["tcpSocket"]["port"]) == listener_port, kind
    service = find("Service", "llm-gateway")
    [port] = service["spec"]["ports"]
    assert port_number("envoy", port["targetPort"]) == listener_port
    admin = bootstrap["admin"]["address"]["socket_address"]["address"]
    assert ipaddress.ip_address(admin).is_loopback  # Envoy's admin never leaves the pod
    assert envoy_bootstrap_text() and arg_after(envoy["args"], "-c") == "/etc/envoy/envoy.yaml"


def test_envoy_args_only_reference_defined_env() -> None:
    envoy = container("envoy")
    referenced = set(re.findall(r"\$\((\w+)\)", " ".join(envoy["args"])))
    defined = {e["name"] for e in envoy.get("env", [])}
    assert referenced == {"POD_NAME"}
    assert referenced <= defined
    assert arg_after(envoy["args"], "--service-node") == "$(POD_NAME)"


# --------------------------------------------------------------------------- pod-wide


def test_selectors_match_the_pod_labels() -> None:
    deployment = find("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (
        deployment["spec"]["selector"]["matchLabels"],
        find("Service", "llm-gateway")["spec"]["selector"],
        find("PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= labels.items(), selector


def test_every_container_is_locked_down() -> None:
    assert pod_spec()["securityContext"]["runAsNonRoot"] is True
    assert pod_spec()["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod_spec()["automountServiceAccountToken"] is False
    for item in all_containers():
        context = item["securityContext"]
        assert context["runAsNonRoot"] is True, item["name"]
        assert context["runAsUser"] > 0, item["name"]
        assert context["allowPrivilegeEscalation"] is False, item["name"]
        assert context["readOnlyRootFilesystem"] is True, item["name"]
        assert context["capabilities"] == {"drop": ["ALL"]}, item["name"]


def test_llm_health_runs_as_the_image_user() -> None:
    uid, _, gid = (final_user(DOCKERFILE.read_text(encoding="utf-8")) or "").partition(":")
    context = container("llm-health")["securityContext"]
    assert (str(context["runAsUser"]), str(context["runAsGroup"])) == (uid, gid)


def test_every_container_has_requests_and_a_memory_limit() -> None:
    for item in all_containers():
        resources = item["resources"]
        assert {"cpu", "memory"} <= resources["requests"].keys(), item["name"]
        assert "memory" in resources["limits"], item["name"]
    # no CPU limit on the prober: throttling would falsify its TTFT measurements
    assert "cpu" not in container("llm-health")["resources"]["limits"]


def test_images_match_the_versions_tested_here() -> None:
    version = pyproject()["project"]["version"]
    assert container("llm-health")["image"].endswith(f"llm-health:{version}")
    envoy_image = container("envoy")["image"]
    assert envoy_image.startswith("envoyproxy/envoy:")
    assert envoy_image.split(":")[1] == f"v{pinned_envoy_version()}"


def _uncommented(text: str) -> str:
    return "\n".join(line.split("#")[0] for line in text.splitlines())


def test_manifest_dir_has_no_stray_files() -> None:
    names = {p.name for p in Path(KUBERNETES).iterdir()}
    assert names == {
        "agent",
        "autoscaling",
        "envoy-config.yaml",
        "fleet",
        "gateway.yaml",
        "kustomization.yaml",
        "llm-health-config.yaml",
        "model-servers.yaml",
        "remediation",
    }
