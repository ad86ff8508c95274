"""The Kubernetes remediation example (deploy/kubernetes/remediation, docs/design.md §13):
the RBAC validates and grants exactly what the hook needs; the hook script refuses what
is not an IP and asks the API server for that IP's pod only; an llm-health config using
it loads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import validate

from llm_health.config import parse_config
from tests.deploy.manifests import KUBERNETES
from tests.deploy.test_kubernetes import K8S_VERSIONS

EXAMPLE = KUBERNETES / "remediation"


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLE / "rbac.yaml").read_text()) if d]


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("delete_pod", EXAMPLE / "delete-pod.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rbac_validates(version: str) -> None:
    for document in documents():
        validate(document, version, strict=True)


def test_rbac_grants_list_and_delete_pods_only_in_the_model_namespace() -> None:
    by_kind = {d["kind"]: d for d in documents()}
    role = by_kind["Role"]
    assert role["metadata"]["namespace"] == "llm"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]}
    ]
    binding = by_kind["RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == by_kind["ServiceAccount"]["metadata"]["name"]


def test_the_hook_asks_for_one_ip_and_refuses_anything_else() -> None:
    module = script()
    url = module.pods_url("https://api:443", "llm", "10.1.2.3")
    assert url == "https://api:443/api/v1/namespaces/llm/pods?fieldSelector=status.podIP%3D10.1.2.3"
    for hostile in ("10.1.2.3&limit=1", "$(id)", "../../x"):
        with pytest.raises(ValueError):
            module.pods_url("https://api:443", "llm", hostile)
    assert module.main(["delete-pod.py"]) == 1  # usage


def test_an_llm_health_config_using_the_hook_loads() -> None:
    text = f"""
remediation:
  - when: {{state: unhealthy, for: 120s, causes: [fatal, timeout]}}
    run: ["{sys.executable}", "/etc/llm-health/hooks/delete-pod.py", "{{host}}", "llm"]
    timeout: 30s
limits: {{max_concurrent_per_cluster: 1, cooldown: 600s, max_per_hour: 6, dry_run: false}}
clusters: [{{name: c, endpoints: [{{address: "10.0.0.1:8000"}}]}}]
"""
    (rule,) = parse_config(text, "x.yaml", {}).remediation
    assert rule.run is not None and rule.run[-2:] == ("{host}", "llm")


def test_example_dir_has_no_stray_files() -> None:
    assert {p.name for p in Path(EXAMPLE).iterdir()} == {"delete-pod.py", "rbac.yaml"}
