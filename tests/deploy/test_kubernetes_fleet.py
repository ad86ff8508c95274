"""deploy/kubernetes/fleet: the fleet-mode overlay (replicas sharing probes through Redis)
validates OFFLINE like the base (test_kubernetes.py).

The overlay is built here in Python: its resources are loaded and its strategic-merge
patches applied with a small merge that covers what the patches use (maps merged, lists
of named items merged by ``name``). When ``kubectl`` is installed, its own kustomize
build must agree with this one; without it that single test is skipped.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import ValidationError, validate

from llm_health.config import Config, parse_config
from llm_health.errors import ConfigError
from tests.deploy.manifests import KUBERNETES, KUSTOMIZATION, Manifest, arg_after
from tests.deploy.test_kubernetes import K8S_VERSIONS

FLEET = KUBERNETES / "fleet"
FLEET_KUSTOMIZATION = FLEET / "kustomization.yaml"
CONFIG_KEY = "llm-health.yaml"
FLEET_KEYS = {"redis", "name", "member_id", "heartbeat", "member_ttl"}
# What the pod would supply: the Secret's URL (a test value here) and the pod name.
POD_ENV = {"LLM_HEALTH_REDIS_URL": "redis://:secret@10.0.0.5:6379/0", "POD_NAME": "gw-0"}


# --------------------------------------------------------------------------- the build


def strategic_merge(base: Any, patch: Any) -> Any:
    """A strategic-merge patch, as far as the overlay uses it: maps merge key by key, a
    list whose items are all maps with a ``name`` merges item by item on that name (new
    items appended), anything else is replaced. ``$patch`` directives are not supported."""
    if isinstance(base, dict) and isinstance(patch, dict):
        assert not any(str(k).startswith("$") for k in patch), f"directive in {patch}"
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value) if key in base else value
        return merged
    if _named_list(base) and _named_list(patch):
        merged_items = list(base)
        index = {item["name"]: i for i, item in enumerate(merged_items)}
        for item in patch:
            if item["name"] in index:
                at = index[item["name"]]
                merged_items[at] = strategic_merge(merged_items[at], item)
            else:
                merged_items.append(item)
        return merged_items
    return copy.deepcopy(patch)


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, dict) and "name" in i for i in value)


def kustomization() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(FLEET_KUSTOMIZATION.read_text(encoding="utf-8"))
    return loaded


def patch_paths() -> list[str]:
    patches = kustomization().get("patches", [])
    for patch in patches:
        assert patch.keys() == {"path"}, f"only file patches without target: {patch}"
    return [str(p["path"]) for p in patches]


def _documents(path: Path) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _identity(document: Manifest) -> tuple[str, str, str]:
    meta = document["metadata"]
    return (document["kind"], meta["name"], meta.get("namespace", ""))


def build(resources: list[Manifest], patches: list[Manifest]) -> list[Manifest]:
    """``resources`` with every patch applied to the one document of its kind and name."""
    built = [copy.deepcopy(d) for d in resources]
    for patch in patches:
        targets = [i for i, d in enumerate(built) if _identity(d) == _identity(patch)]
        assert len(targets) == 1, f"patch {_identity(patch)} matches {len(targets)} resources"
        built[targets[0]] = strategic_merge(built[targets[0]], patch)
    return built


def overlay() -> list[Manifest]:
    """What `kubectl kustomize` builds from deploy/kubernetes/fleet."""
    resources = [d for name in kustomization()["resources"] for d in _documents(FLEET / name)]
    patches = [d for name in patch_paths() for d in _documents(FLEET / name)]
    return build(resources, patches)


def find_in(documents: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    matches = [d for d in documents if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def llm_health_container(documents: list[Manifest]) -> dict[str, Any]:
    spec = find_in(documents, "Deployment")["spec"]["template"]["spec"]
    [found] = [c for c in spec.get("initContainers", []) if c["name"] == "llm-health"]
    return dict(found)


def mounted_config_text(documents: list[Manifest]) -> str:
    """The llm-health.yaml the llm-health container reads (--config), followed through
    its volume mount to the ConfigMap of the built overlay."""
    item = llm_health_container(documents)
    config_path = PurePosixPath(arg_after(item["args"], "--config"))
    [mount] = [m for m in item["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    spec = find_in(documents, "Deployment")["spec"]["template"]["spec"]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    configmap = find_in(documents, "ConfigMap", volume["configMap"]["name"])
    return str(configmap["data"][config_path.name])


def fleet_config(environ: dict[str, str] | None = None) -> Config:
    return parse_config(
        mounted_config_text(overlay()), "fleet/llm-health-config.yaml", environ or POD_ENV
    )


def _uncommented(text: str) -> str:
    return "\n".join(line.split("#")[0] for line in text.splitlines())


def _normalised(value: Any) -> Any:
    """Named lists sorted by name: kustomize puts a patch's new items first."""
    if isinstance(value, dict):
        return {k: _normalised(v) for k, v in value.items()}
    if _named_list(value):
        return [_normalised(i) for i in sorted(value, key=lambda i: str(i["name"]))]
    if isinstance(value, list):
        return [_normalised(i) for i in value]
    return value


# --------------------------------------------------------------------------- kustomize


def test_the_overlay_dir_holds_exactly_what_its_kustomization_lists() -> None:
    listed = [*kustomization()["resources"], *patch_paths()]
    for name in listed:
        assert (FLEET / name).is_file(), f"{name} does not exist"
    own = {PurePosixPath(n).name for n in listed if "/" not in n}
    assert {p.name for p in FLEET.iterdir()} == own | {"kustomization.yaml"}


def test_the_overlay_builds_on_the_whole_base() -> None:
    """Every file the base kustomization lists, and nothing else from outside."""
    base = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))["resources"]
    outside = [n for n in kustomization()["resources"] if n.startswith("../")]
    assert sorted(outside) == sorted(f"../{n}" for n in base)


def test_the_build_is_the_base_plus_the_fleet_secret() -> None:
    base = [
        d
        for n in kustomization()["resources"]
        if n.startswith("../")
        for d in _documents(FLEET / n)
    ]
    assert sorted(map(_identity, overlay())) == sorted(
        [*map(_identity, base), ("Secret", "llm-health-fleet", "")]
    )


def test_the_merge_keeps_base_items_and_adds_new_ones() -> None:
    base = {"spec": {"replicas": 2, "c": [{"name": "a", "env": [{"name": "X", "value": "1"}]}]}}
    patch = {"spec": {"replicas": 3, "c": [{"name": "a", "env": [{"name": "Y", "value": "2"}]}]}}
    assert strategic_merge(base, patch) == {
        "spec": {
            "replicas": 3,
            "c": [{"name": "a", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}],
        }
    }
    assert base["spec"]["replicas"] == 2  # the input is not modified
    document = {"kind": "Deployment", "metadata": {"name": "x"}}
    with pytest.raises(AssertionError, match="matches 0 resources"):
        build([document], [{"kind": "Deployment", "metadata": {"name": "y"}}])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_builds_the_same() -> None:
    """The command kustomization.yaml documents, and the same result as the build here."""
    command = ["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(FLEET)]
    assert " ".join(command[1:4]) in FLEET_KUSTOMIZATION.read_text(encoding="utf-8")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    built = [d for d in yaml.safe_load_all(done.stdout) if d]
    key = _identity
    assert [_normalised(d) for d in sorted(built, key=key)] == [
        _normalised(d) for d in sorted(overlay(), key=key)
    ]


# --------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_overlay_document_validates_against_the_kubernetes_schema(version: str) -> None:
    """Strict, on the built overlay (a patch alone is not a complete object)."""
    for document in overlay():
        try:
            validate(document, version, strict=True)
        except ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{_identity(document)}: {where}: {exc.message}")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_overlay_files_that_are_whole_objects_validate_alone(version: str) -> None:
    """The Secret and the replacement ConfigMap are complete objects by themselves."""
    for name in ("secret.yaml", "llm-health-config.yaml"):
        for document in _documents(FLEET / name):
            validate(document, version, strict=True)


def test_the_gateway_runs_three_replicas() -> None:
    deployment = find_in(overlay(), "Deployment", "llm-gateway")
    assert deployment["spec"]["replicas"] == 3
    # the rest of the base pod is untouched: Envoy, the llm-health sidecar, its probes
    base = find_in(_documents(KUBERNETES / "gateway.yaml"), "Deployment")
    spec, base_spec = deployment["spec"]["template"]["spec"], base["spec"]["template"]["spec"]
    assert spec["containers"] == base_spec["containers"]
    ours, theirs = spec["initContainers"][0], base_spec["initContainers"][0]
    assert {k: v for k, v in ours.items() if k != "env"} == {
        k: v for k, v in theirs.items() if k != "env"
    }


# --------------------------------------------------------------------------- llm-health


def test_the_fleet_config_loads_with_llm_healths_own_loader() -> None:
    config = fleet_config()
    fleet = config.fleet
    assert fleet is not None
    assert fleet.redis.get_secret_value() == POD_ENV["LLM_HEALTH_REDIS_URL"]
    assert fleet.name == "prod-gateway"
    assert fleet.member_id == POD_ENV["POD_NAME"]
    assert (fleet.heartbeat, fleet.member_ttl) == (1.0, 3.0)
    assert fleet.member_ttl >= 2 * fleet.heartbeat
    assert fleet.where == "redis://10.0.0.5:6379/0"  # what logs show: no password
    raw = yaml.safe_load(mounted_config_text(overlay()))["fleet"]
    assert raw.keys() == FLEET_KEYS
    assert raw["redis"] == "${LLM_HEALTH_REDIS_URL}"  # the URL itself stays in the Secret


def test_the_fleet_config_accepts_the_shipped_secret_and_a_real_pod_name() -> None:
    """End to end with the values the pod gets: the Secret's (placeholder) URL and a
    Deployment pod name."""
    url = find_in(overlay(), "Secret", "llm-health-fleet")["stringData"]["redis-url"]
    config = fleet_config({"LLM_HEALTH_REDIS_URL": url, "POD_NAME": "llm-gateway-5d8f7-x2k4q"})
    assert config.fleet is not None and config.fleet.member_id == "llm-gateway-5d8f7-x2k4q"


def test_the_loader_refuses_a_redis_url_without_a_password() -> None:
    """The check above can fail: a non-loopback Redis without credentials is refused."""
    env = {**POD_ENV, "LLM_HEALTH_REDIS_URL": "redis://redis.llm.svc.cluster.local:6379/0"}
    with pytest.raises(ConfigError, match="credentials"):
        fleet_config(env)


def test_the_fleet_payload_is_the_base_payload_plus_fleet() -> None:
    """The overlay's ConfigMap replaces the base one's whole llm-health.yaml: apart from
    `fleet:` the two must not drift apart."""
    base_text = find_in(_documents(KUBERNETES / "llm-health-config.yaml"), "ConfigMap")
    base = yaml.safe_load(base_text["data"][CONFIG_KEY])
    ours = yaml.safe_load(mounted_config_text(overlay()))
    assert "fleet" not in base
    assert {k: v for k, v in ours.items() if k != "fleet"} == base
    base_meta = find_in(_documents(KUBERNETES / "llm-health-config.yaml"), "ConfigMap")["metadata"]
    assert find_in(overlay(), "ConfigMap", "llm-health-config")["metadata"] == base_meta


def test_every_env_reference_in_the_config_is_provided_to_the_container() -> None:
    documents = overlay()
    text = _uncommented(mounted_config_text(documents))
    referenced = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    env = {e["name"]: e for e in llm_health_container(documents).get("env", [])}
    assert {"LLM_HEALTH_REDIS_URL", "POD_NAME"} <= referenced
    assert referenced <= env.keys(), referenced - env.keys()
    redis = env["LLM_HEALTH_REDIS_URL"]["valueFrom"]
    assert redis.keys() == {"secretKeyRef"}  # the password never sits in the manifest
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    for name, item in env.items():
        if name != "POD_NAME":
            assert "secretKeyRef" in item.get("valueFrom", {}), name


def test_every_required_secret_key_exists_in_the_overlay() -> None:
    """A non-optional secretKeyRef to a missing Secret or key keeps the pod from starting
    (CreateContainerConfigError). Optional ones (the base's VLLM_API_KEY) may be absent."""
    documents = overlay()
    secrets = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Secret"}
    refs = [
        e["valueFrom"]["secretKeyRef"]
        for e in llm_health_container(documents).get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    required = [r for r in refs if not r.get("optional", False)]
    assert {(r["name"], r["key"]) for r in required} == {("llm-health-fleet", "redis-url")}
    for ref in required:
        secret = secrets[ref["name"]]
        assert ref["key"] in {**secret.get("data", {}), **secret.get("stringData", {})}


def test_the_shipped_redis_password_is_a_marked_placeholder() -> None:
    secret = find_in(overlay(), "Secret", "llm-health-fleet")
    url = secret["stringData"]["redis-url"]
    assert "REPLACE-ME" in url, "the example password must be obviously a placeholder"
    assert url.startswith(("redis://", "rediss://", "unix://"))
    assert "data" not in secret  # readable in the file: stringData, not base64
