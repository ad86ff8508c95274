"""deploy/kubernetes/autoscaling: the HPA on real traffic's quality validates against the
Kubernetes schema, and every series it and the adapter rule name is one llm-health
exports (the traffic component's families, with one endpoint on the board)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import validate

from llm_health.app.assemble import build_runtime
from llm_health.config import parse_config
from tests.deploy.manifests import KUBERNETES

HPA = KUBERNETES / "autoscaling" / "hpa-quality.yaml"
VERSION = "1.30"


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(HPA.read_text(encoding="utf-8")) if d]


def exported() -> set[str]:
    config = "clusters: [{name: llama-70b, endpoints: [{address: '10.0.0.1:8000'}]}]"
    runtime = build_runtime(parse_config(config, "t.yaml", {}))
    (traffic,) = [c for c in runtime.components if c.name == "traffic"]
    return {family.name for family in traffic.metrics()}


@pytest.mark.parametrize("index", [0, 1])
def test_the_manifests_validate(index: int) -> None:
    validate(documents()[index], VERSION, strict=True)


def test_every_series_named_is_exported() -> None:
    config, hpa = documents()
    rules = yaml.safe_load(config["data"]["config.yaml"])["externalRules"]
    named = {re.match(r"[a-z0-9_:]+", rule["seriesQuery"].strip("'")).group(0) for rule in rules}  # type: ignore[union-attr]
    named |= {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert named and named <= exported(), named - exported()
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
