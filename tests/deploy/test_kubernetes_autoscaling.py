"""deploy/kubernetes/autoscaling: the HPA on real traffic's quality validates against the
Kubernetes schema, and every series it and the adapter rule name is one llm-health
exports (from the traffic component's /status, as /metrics builds it)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import validate

from llm_health.ops.metrics import traffic_families
from tests.deploy.manifests import KUBERNETES

HPA = KUBERNETES / "autoscaling" / "hpa-quality.yaml"
VERSION = "1.30"


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(HPA.read_text(encoding="utf-8")) if d]


def exported() -> set[str]:
    window = {"requests": 100, "error_rate": 0.0, "p50_ttft_s": 0.1, "p95_ttft_s": 0.9}
    status = {"endpoints": {"llama-70b/10.0.0.1:8000": window}, "clusters": {"llama-70b": window}}
    return {family.name for family in traffic_families(status)}


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
