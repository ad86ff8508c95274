"""The /status JSON document, from a HealthSnapshot (no secrets: none are in snapshots)."""

from __future__ import annotations

import time
from typing import Any

from llm_health.model.board import ClusterSnapshot, EndpointSnapshot, HealthSnapshot
from llm_health.model.outcome import round_ms


def status_document(
    snapshot: HealthSnapshot, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "revision": snapshot.revision,
        "generated_at": _iso(time.time()),
        "clusters": [_cluster(c) for c in snapshot.clusters.values()],
    }
    doc.update(extra or {})
    return doc


def _cluster(cluster: ClusterSnapshot) -> dict[str, Any]:
    return {
        "name": cluster.name,
        "warm": cluster.warm,
        "envoy_version": cluster.envoy_version,
        "endpoints": [_endpoint(e) for e in cluster.endpoints],
    }


def _endpoint(endpoint: EndpointSnapshot) -> dict[str, Any]:
    last = endpoint.last
    return {
        "address": endpoint.spec.address,
        "state": endpoint.state.value,
        "reason": endpoint.reason,
        "cause": endpoint.cause.value,
        "since": _iso(endpoint.since),
        "since_epoch": round(endpoint.since, 3),
        "base_weight": endpoint.spec.weight,
        "probe_state": None if endpoint.probe_state is None else endpoint.probe_state.value,
        "override_until": None
        if endpoint.override_until is None
        else _iso(endpoint.override_until),
        "signals": dict(endpoint.signals),
        "limits": dict(endpoint.limits),
        "removing": endpoint.removing,
        "envoy": {
            "health_status": endpoint.view.health.value,
            "weight": endpoint.view.weight,
            "lb_label": endpoint.view.lb_label,
        },
        "last_probe": None
        if last is None
        else {
            "outcome": last.outcome.value,
            "ttft_ms": round_ms(last.ttft_ms),
            "connect_ms": round_ms(last.connect_ms),
            "headers_ms": round_ms(last.headers_ms),
            "status": last.status,
            "detail": last.detail,
            "loop_lag_ms": round_ms(last.loop_lag_ms),
            "at": _iso(last.started_at),
        },
    }


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"
