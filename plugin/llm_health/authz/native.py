"""Admission inside Envoy (docs/admission.md "Admission inside Envoy"): the runtime values
the plugin pushes over RTDS for Envoy's own filters to act on. Pure.

``llm_health.shed_low.<cluster>`` is the percentage (0 or 100) of ``priority_header: low``
requests Envoy's fault filter answers 429 on that cluster's route (``HTTPFault``
``abort_percent_runtime``). 100 exactly when ``decide`` would shed them: admission on,
the cluster probed since start (warm), some endpoint routable, capacity below
``shed_below``. Nothing routable is not shed: Envoy answers 503 itself then (no healthy
upstream, the cluster's panic threshold is 0), as ``decide`` does.
"""

from __future__ import annotations

from llm_health.authz.settings import AuthzConfig
from llm_health.authz.view import cluster_capacity
from llm_health.model.board import ClusterSnapshot, HealthSnapshot

SHED_KEY_PREFIX = "llm_health.shed_low."


def shed_key(cluster: str) -> str:
    return SHED_KEY_PREFIX + cluster


def shed_layer(snapshot: HealthSnapshot, settings: AuthzConfig) -> dict[str, float]:
    """The runtime layer: one shed percentage per cluster of the snapshot."""
    return {shed_key(name): _shed(c, settings) for name, c in snapshot.clusters.items()}


def _shed(cluster: ClusterSnapshot, settings: AuthzConfig) -> float:
    if not settings.enabled or not cluster.warm:
        return 0
    capacity = cluster_capacity(cluster)
    return 100 if capacity.routable and capacity.ratio < settings.shed_below else 0
