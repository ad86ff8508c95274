"""deploy/kubernetes/agent: vLLM pods judged by `llm-health agent` (a native sidecar),
validated OFFLINE like the base (test_kubernetes.py): the Kubernetes schemas
(``kubernetes-validate``), llm-health's own validator for both embedded configs, and every
number the manifests share (ports, probe paths, the probe arithmetic, the Service's
selector, the discovery name) checked against the others.

Each rule is a ``check_*`` function of the built documents, run once on what is shipped
and once on a copy broken on purpose (``test_every_check_can_fail``), so none of them
passes vacuously. The directory is built here in Python (its kustomization only lists
resources); when ``kubectl`` is installed its own kustomize build must agree.
"""

from __future__ import annotations

import copy
import ipaddress
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import ValidationError, validate

from llm_health.config import Config, ProbeSettings, parse_config, split_address
from llm_health.config.agent import parse_agent_config
from llm_health.errors import ConfigError
from tests.deploy.manifests import (
    DOCKERFILE,
    KUBERNETES,
    ROOT,
    Manifest,
    arg_after,
    final_user,
    pyproject,
)
from tests.deploy.test_kubernetes import K8S_VERSIONS
from tests.envoy_harness import eds_clusters

AGENT_DIR = KUBERNETES / "agent"
AGENT_KUSTOMIZATION = AGENT_DIR / "kustomization.yaml"
GATEWAY_SNIPPET = AGENT_DIR / "gateway-llm-health.yaml"
SIDECAR_BOOTSTRAP = ROOT / "envoy-configs" / "sidecar-ads.yaml"
SIDECAR, ENGINE = "llm-health-agent", "vllm"
AGENT_KEYS = {"ready_when_degraded", "restart_after"}
# The warm-up model-server.yaml states for a 70B model (weights from the local cache, CUDA
# graphs, KV cache): the startup probe's budget must exceed it.
STATED_WARM_UP_S = 600
# A killed agent answers again within this (Python start, config, bind).
AGENT_RESTART_S = 5
# What the comments promise: NotReady within 5 s of a hang; /livez acted on 5.5 min after.
READY_WITHIN_S = 5.0
RESTART_WITHIN_S = 330.0
Check = Callable[[list[Manifest]], None]


# --------------------------------------------------------------------------- the build


def kustomization() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(AGENT_KUSTOMIZATION.read_text(encoding="utf-8"))
    return loaded


def _documents(path: Path) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def built() -> list[Manifest]:
    """What `kubectl kustomize deploy/kubernetes/agent` builds: the listed resources, as
    they are (the kustomization has no patches, generators or transformers)."""
    extra = kustomization().keys() - {"apiVersion", "kind", "resources"}
    assert not extra, f"the build here covers resources only, not {sorted(extra)}"
    return [d for name in kustomization()["resources"] for d in _documents(AGENT_DIR / name)]


def _identity(document: Manifest) -> tuple[str, str, str]:
    meta = document["metadata"]
    return (document["kind"], meta["name"], meta.get("namespace", ""))


def find_in(documents: list[Manifest], kind: str) -> Manifest:
    matches = [d for d in documents if d["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, found {len(matches)}"
    return matches[0]


def pod_spec(documents: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = find_in(documents, "Deployment")["spec"]["template"]["spec"]
    return spec


def container(documents: list[Manifest], name: str) -> dict[str, Any]:
    spec = pod_spec(documents)
    for item in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        if item["name"] == name:
            return dict(item)
    raise AssertionError(f"no container {name!r} in the model-server pod")


def container_port(item: dict[str, Any], port: int | str) -> int:
    """A port of ``item`` by number or name, as a number; AssertionError when it has none."""
    for declared in item.get("ports", []):
        if port in (declared["containerPort"], declared.get("name")):
            return int(declared["containerPort"])
    raise AssertionError(f"{item['name']}: no container port {port!r}")


def mounted_text(documents: list[Manifest], who: str, file_path: str) -> str:
    """The file ``who`` sees at ``file_path``, followed through its volume mount to the
    ConfigMap of the build."""
    path = PurePosixPath(file_path)
    mounts = {m["mountPath"]: m for m in container(documents, who).get("volumeMounts", [])}
    assert str(path.parent) in mounts, f"{who}: nothing mounted at {path.parent}"
    mount = mounts[str(path.parent)]
    assert "subPath" not in mount, f"{who}: subPath mounts never see ConfigMap updates"
    volumes = {v["name"]: v for v in pod_spec(documents)["volumes"]}
    name = volumes[mount["name"]]["configMap"]["name"]
    [configmap] = [d for d in documents if _identity(d)[:2] == ("ConfigMap", name)]
    assert path.name in configmap["data"], f"ConfigMap {name} has no key {path.name}"
    return str(configmap["data"][path.name])


def agent_config_text(documents: list[Manifest]) -> str:
    args = container(documents, SIDECAR)["args"]
    return mounted_text(documents, SIDECAR, arg_after(args, "--config"))


def agent_config(text: str) -> tuple[ProbeSettings, dict[str, Any]]:
    """The agent's file, through the agent's own loader (``config.agent``): its ``probe:``
    section and its ``agent:`` keys."""
    file = parse_agent_config(text, "agent-config.yaml", {})
    return file.probe, file.agent.model_dump()


def gateway_config() -> Config:
    return parse_config(GATEWAY_SNIPPET.read_text(encoding="utf-8"), GATEWAY_SNIPPET.name, {})


def engine_port(documents: list[Manifest]) -> int:
    [port] = container(documents, ENGINE)["ports"]
    return int(port["containerPort"])


def agent_port(documents: list[Manifest]) -> int:
    sidecar = container(documents, SIDECAR)
    _, port = split_address(arg_after(sidecar["args"], "--http"))
    return container_port(sidecar, port)


def _probe(documents: list[Manifest], kind: str) -> dict[str, Any]:
    probe: dict[str, Any] = container(documents, ENGINE)[kind]
    return probe


def _budget(probe: dict[str, Any]) -> int:
    return int(probe["failureThreshold"]) * int(probe.get("periodSeconds", 10))


# --------------------------------------------------------------------------- checks


def check_the_agent_is_a_native_sidecar(documents: list[Manifest]) -> None:
    spec = pod_spec(documents)
    assert [c["name"] for c in spec.get("initContainers", [])] == [SIDECAR]
    assert spec["initContainers"][0].get("restartPolicy") == "Always", "not a native sidecar"
    assert [c["name"] for c in spec["containers"]] == [ENGINE]
    version = pyproject()["project"]["version"]
    assert container(documents, SIDECAR)["image"] == f"llm-health:{version}"


def check_the_agent_args(documents: list[Manifest]) -> None:
    sidecar = container(documents, SIDECAR)
    assert "command" not in sidecar  # the image's ENTRYPOINT (the console script) runs
    args = sidecar["args"]
    assert args[0] == "agent", args
    assert arg_after(args, "--engine") == f"http://127.0.0.1:{engine_port(documents)}"
    host, _ = split_address(arg_after(args, "--http"))
    # the kubelet probes the pod IP: a loopback-only agent would fail every probe
    assert not ipaddress.ip_address(host).is_loopback, host
    assert agent_port(documents) == 18090
    assert arg_after(args, "--config") == "/etc/llm-health-agent/agent.yaml"


def check_the_engine_probes_ask_the_agent(documents: list[Manifest]) -> None:
    """By port NUMBER: a name resolves only among the probed container's own ports."""
    paths = {"startupProbe": "/startupz", "readinessProbe": "/readyz", "livenessProbe": "/livez"}
    for kind, path in paths.items():
        get = _probe(documents, kind)["httpGet"]
        assert isinstance(get["port"], int), f"{kind}: port {get['port']!r} is not a number"
        assert get["port"] == agent_port(documents), (kind, get["port"])
        assert get["path"] == path, (kind, get["path"])
        assert _probe(documents, kind)["timeoutSeconds"] == 1, kind
    sidecar = container(documents, SIDECAR)
    own = sidecar["livenessProbe"]["httpGet"]
    assert own["path"] == "/healthz"
    assert container_port(sidecar, own["port"]) == agent_port(documents)


def check_the_startup_budget_covers_the_warm_up(documents: list[Manifest]) -> None:
    """failureThreshold x periodSeconds above the warm-up: liveness and readiness only
    start once it passed, so a model still loading is never killed."""
    startup = _probe(documents, "startupProbe")
    assert _budget(startup) >= STATED_WARM_UP_S, _budget(startup)


def check_readiness_follows_the_agent_at_once(documents: list[Manifest]) -> None:
    """The agent has the hysteresis; the kubelet adds none. Its /readyz turns 503 at
    most interval x unhealthy_after + timeout after a hang, the kubelet within a period."""
    ready = _probe(documents, "readinessProbe")
    assert (ready["failureThreshold"], ready["successThreshold"]) == (1, 1)
    assert ready["periodSeconds"] == 2
    probe, _ = agent_config(agent_config_text(documents))
    agent_s = probe.interval * probe.unhealthy_after + probe.timeout
    assert agent_s + _budget(ready) <= READY_WITHIN_S, agent_s + _budget(ready)


def check_liveness_acts_after_restart_after(documents: list[Manifest]) -> None:
    live = _probe(documents, "livenessProbe")
    assert 1 <= live["failureThreshold"] <= 3 and live["periodSeconds"] == 10, live
    _, agent = agent_config(agent_config_text(documents))
    assert agent["restart_after"] is not None
    assert agent["restart_after"] + _budget(live) <= RESTART_WITHIN_S


def check_an_agent_restart_never_restarts_the_engine(documents: list[Manifest]) -> None:
    """A hung agent is killed and back before the engine's liveness (which asks it) has
    failed failureThreshold times in a row, (failureThreshold - 1) x period apart."""
    own = container(documents, SIDECAR)["livenessProbe"]
    live = _probe(documents, "livenessProbe")
    agent_gone_s = _budget(own) + AGENT_RESTART_S
    assert agent_gone_s < (live["failureThreshold"] - 1) * live["periodSeconds"], agent_gone_s


def check_the_agent_is_locked_down(documents: list[Manifest]) -> None:
    context = container(documents, SIDECAR)["securityContext"]
    uid, _, gid = (final_user(DOCKERFILE.read_text(encoding="utf-8")) or "").partition(":")
    assert (str(context["runAsUser"]), str(context["runAsGroup"])) == (uid, gid) == ("10001",) * 2
    assert context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    spec = pod_spec(documents)
    assert spec["automountServiceAccountToken"] is False  # self-healing needs no RBAC
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def check_the_agent_has_no_cpu_limit(documents: list[Manifest]) -> None:
    """CFS throttling would stall the event loop and falsify the TTFT it measures."""
    resources = container(documents, SIDECAR)["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert "memory" in resources["limits"]
    assert "cpu" not in resources["limits"], "no CPU limit on the prober"


def check_the_engine(documents: list[Manifest]) -> None:
    engine = container(documents, ENGINE)
    assert engine["image"].startswith("vllm/vllm-openai:v"), "pin a vLLM release"
    args = engine["args"]
    assert int(arg_after(args, "--port")) == engine_port(documents)
    resources = engine["resources"]
    gpus = resources["limits"]["nvidia.com/gpu"]
    assert resources["requests"].get("nvidia.com/gpu", gpus) == gpus  # extended resource
    assert int(arg_after(args, "--tensor-parallel-size")) == gpus
    probe, _ = agent_config(agent_config_text(documents))
    assert probe.model == arg_after(args, "--model")


def check_the_headless_service(documents: list[Manifest]) -> None:
    service = find_in(documents, "Service")
    spec = service["spec"]
    assert spec["clusterIP"] == "None"
    # NotReady pods leave every consumer, the gateway-side DNS discovery included
    assert spec["publishNotReadyAddresses"] is False
    deployment = find_in(documents, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"] and spec["selector"].items() <= labels.items(), spec["selector"]
    match = deployment["spec"]["selector"]["matchLabels"]
    assert match.items() <= labels.items(), match
    [port] = spec["ports"]
    assert port["port"] == engine_port(documents)
    assert container_port(container(documents, ENGINE), port["targetPort"]) == port["port"]
    namespaces = {d["metadata"].get("namespace") for d in documents}
    assert namespaces == {service["metadata"]["namespace"]}, namespaces


def check_the_gateway_discovers_the_service(documents: list[Manifest]) -> None:
    service = find_in(documents, "Service")
    meta = service["metadata"]
    (cluster,) = gateway_config().clusters
    discovery = cluster.discovery
    assert discovery is not None and discovery.kind == "dns"
    assert discovery.name == f"{meta['name']}.{meta['namespace']}.svc.cluster.local"
    assert discovery.port == service["spec"]["ports"][0]["port"]
    probe, _ = agent_config(agent_config_text(documents))
    assert cluster.model == probe.model
    bootstrap = yaml.safe_load(SIDECAR_BOOTSTRAP.read_text(encoding="utf-8"))
    assert cluster.name in {c["name"] for c in eds_clusters(bootstrap)}, cluster.name


CHECKS: list[Check] = [
    check_the_agent_is_a_native_sidecar,
    check_the_agent_args,
    check_the_engine_probes_ask_the_agent,
    check_the_startup_budget_covers_the_warm_up,
    check_readiness_follows_the_agent_at_once,
    check_liveness_acts_after_restart_after,
    check_an_agent_restart_never_restarts_the_engine,
    check_the_agent_is_locked_down,
    check_the_agent_has_no_cpu_limit,
    check_the_engine,
    check_the_headless_service,
    check_the_gateway_discovers_the_service,
]


# --------------------------------------------------------------------------- files, schemas


def test_the_dir_holds_the_resources_the_snippet_and_nothing_else() -> None:
    names = {p.name for p in AGENT_DIR.iterdir()}
    listed = set(kustomization()["resources"])
    assert all("/" not in n for n in listed), "the agent directory stands alone"
    assert names == listed | {"kustomization.yaml", GATEWAY_SNIPPET.name}
    assert GATEWAY_SNIPPET.name not in listed  # a gateway config, not a Kubernetes object
    assert "apiVersion" not in yaml.safe_load(GATEWAY_SNIPPET.read_text(encoding="utf-8"))


def test_the_expected_objects_are_shipped() -> None:
    assert sorted(map(_identity, built())) == [
        ("ConfigMap", "llm-health-agent-config", "llm"),
        ("Deployment", "llama-70b", "llm"),
        ("Service", "llama-70b", "llm"),
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(version: str) -> None:
    """Strict: unknown fields are errors too. K8S_VERSIONS start at 1.30 (native
    sidecars: 1.29; the engine's preStop sleep: 1.30)."""
    assert tuple(map(int, K8S_VERSIONS[0].split("."))) >= (1, 30)
    for document in built():
        try:
            validate(document, version, strict=True)
        except ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{_identity(document)}: {where}: {exc.message}")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["initContainers"][0].update(restartPolicy=1), "is not of type 'string'"),
        (lambda s: s["containers"][0].update(readinesProbe={}), "Additional properties"),
        (
            lambda s: s["containers"][0]["livenessProbe"].update(periodSeconds="10"),
            "is not of type 'integer'",
        ),
    ],
)
def test_the_schema_validation_can_fail(edit: Callable[[Any], None], message: str) -> None:
    deployment = copy.deepcopy(find_in(built(), "Deployment"))
    edit(deployment["spec"]["template"]["spec"])
    with pytest.raises(ValidationError) as caught:
        validate(deployment, K8S_VERSIONS[-1], strict=True)
    assert message in caught.value.message


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_builds_the_same() -> None:
    command = ["kubectl", "kustomize", str(AGENT_DIR)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    from_kubectl = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert sorted(from_kubectl, key=_identity) == sorted(built(), key=_identity)


# --------------------------------------------------------------------------- the configs


def test_the_agent_config_validates() -> None:
    """The shipped agent config loads with the agent's own loader."""
    probe, agent = agent_config(agent_config_text(built()))
    assert probe.engine == "vllm" and probe.model
    assert agent == {"ready_when_degraded": True, "restart_after": 300.0, "event_loop": "auto"}


@pytest.mark.parametrize(
    ("edit", "problem", "match"),
    [
        ("  timeout: 800ms", "  timeout: 80x", 'probe.timeout: "80x" is not a dur'),
        ("  restart_after: 5m", "  restart_after: 5 minutes", "agent.restart_after: .* not a dur"),
        ("  restart_after: 5m", "  restart_after: 5m\n  restart: 1m", "agent.restart: unknown key"),
        ("probe:", "clusters: []\nprobe:", "clusters: not used by the agent"),
    ],
)
def test_a_broken_agent_config_is_refused(edit: str, problem: str, match: str) -> None:
    text = agent_config_text(built())
    assert edit in text
    with pytest.raises(ConfigError, match=match):
        agent_config(text.replace(edit, problem, 1))


def test_the_gateway_snippet_validates() -> None:
    (cluster,) = gateway_config().clusters
    assert cluster.endpoints == ()  # every endpoint comes from the Service's DNS name


# --------------------------------------------------------------------------- the rules


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_the_shipped_manifests_pass(check: Check) -> None:
    check(built())


def _engine(docs: list[Manifest]) -> dict[str, Any]:
    item: dict[str, Any] = pod_spec(docs)["containers"][0]
    return item


def _sidecar(docs: list[Manifest]) -> dict[str, Any]:
    item: dict[str, Any] = pod_spec(docs)["initContainers"][0]
    return item


def _set_agent_key(docs: list[Manifest], old: str, new: str) -> None:
    configmap = find_in(docs, "ConfigMap")
    configmap["data"]["agent.yaml"] = configmap["data"]["agent.yaml"].replace(old, new)


def _move_sidecar(docs: list[Manifest]) -> None:
    spec = pod_spec(docs)
    spec["containers"].append(spec.pop("initContainers")[0])


BROKEN: list[tuple[Check, Callable[[list[Manifest]], None]]] = [
    (check_the_agent_is_a_native_sidecar, lambda d: _sidecar(d).pop("restartPolicy")),
    (check_the_agent_is_a_native_sidecar, _move_sidecar),
    (check_the_agent_args, lambda d: _engine(d)["ports"][0].update(containerPort=8080)),
    (check_the_agent_args, lambda d: _sidecar(d)["args"].__setitem__(4, "127.0.0.1:18090")),
    (
        check_the_engine_probes_ask_the_agent,
        lambda d: _engine(d)["readinessProbe"]["httpGet"].update(port="agent-http"),
    ),
    (
        check_the_engine_probes_ask_the_agent,
        lambda d: _engine(d)["livenessProbe"]["httpGet"].update(path="/health"),
    ),
    (
        check_the_engine_probes_ask_the_agent,
        lambda d: _engine(d)["startupProbe"]["httpGet"].update(port=8000),
    ),
    (
        check_the_startup_budget_covers_the_warm_up,
        lambda d: _engine(d)["startupProbe"].update(failureThreshold=30),
    ),
    (
        check_readiness_follows_the_agent_at_once,
        lambda d: _engine(d)["readinessProbe"].update(failureThreshold=3),
    ),
    (
        check_readiness_follows_the_agent_at_once,
        lambda d: _set_agent_key(d, "unhealthy_after: 2", "unhealthy_after: 5"),
    ),
    (
        check_liveness_acts_after_restart_after,
        lambda d: _set_agent_key(d, "restart_after: 5m", "restart_after: 10m"),
    ),
    (
        check_liveness_acts_after_restart_after,
        lambda d: _engine(d)["livenessProbe"].update(failureThreshold=6),
    ),
    (
        check_an_agent_restart_never_restarts_the_engine,
        lambda d: _sidecar(d)["livenessProbe"].update(failureThreshold=3),
    ),
    (
        check_the_agent_is_locked_down,
        lambda d: _sidecar(d)["securityContext"].update(runAsUser=0),
    ),
    (
        check_the_agent_is_locked_down,
        lambda d: _sidecar(d)["securityContext"].update(readOnlyRootFilesystem=False),
    ),
    (
        check_the_agent_has_no_cpu_limit,
        lambda d: _sidecar(d)["resources"]["limits"].update(cpu="500m"),
    ),
    (check_the_engine, lambda d: _engine(d)["args"].__setitem__(5, "8")),
    (check_the_engine, lambda d: _engine(d)["args"].__setitem__(1, "meta-llama/Other")),
    (
        check_the_headless_service,
        lambda d: find_in(d, "Service")["spec"].update(publishNotReadyAddresses=True),
    ),
    (
        check_the_headless_service,
        lambda d: find_in(d, "Service")["spec"]["selector"].update(
            {"app.kubernetes.io/instance": "llama-8b"}
        ),
    ),
    (
        check_the_gateway_discovers_the_service,
        lambda d: find_in(d, "Service")["metadata"].update(name="vllm"),
    ),
]


@pytest.mark.parametrize(
    ("check", "edit"), BROKEN, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(BROKEN)]
)
def test_every_check_can_fail(check: Check, edit: Callable[[list[Manifest]], None]) -> None:
    documents = copy.deepcopy(built())
    edit(documents)
    with pytest.raises(AssertionError):
        check(documents)


def test_every_check_is_shown_failing() -> None:
    assert {c for c, _ in BROKEN} == set(CHECKS)
