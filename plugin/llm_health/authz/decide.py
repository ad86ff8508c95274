"""The admission rules (docs/design.md §5.3): a pure function of (request, view, settings).

In order:
1. ``enabled: false``: OK, nothing touched.
2. The probe header sent by a client, in ``deny`` mode: 403, whatever the cluster.
3. The target cluster: ``context_extensions[cluster_key]`` (set per route in Envoy), else
   the ``cluster_header`` request header. None, or one not in the config: OK, and a
   problem to log. A cluster not fully probed since start: OK (the plugin just restarted
   and knows nothing yet; Envoy still has the last pushed endpoints, docs/design.md §7).
4. No HEALTHY or DEGRADED endpoint: 503 + Retry-After, at once.
5. Capacity below ``shed_below`` and priority ``low``: 429 + Retry-After.
6. Priority ``high`` and a HEALTHY endpoint exists: the routing header is set (Envoy
   re-matches the route and picks the HEALTHY subset).
7. Otherwise OK, with the capacity header.
On every allowed request, whatever the rule: a client-sent probe header is stripped
(``strip`` mode), and a client-sent routing header is overwritten unless rule 6 set it,
so clients cannot select the HEALTHY-only route by themselves.
"""

from __future__ import annotations

from dataclasses import replace

from llm_health.authz.decision import AdmissionRequest, Decision, Problem, Rule
from llm_health.authz.settings import UNROUTED_VALUE, AuthzConfig
from llm_health.authz.view import AdmissionView, ClusterAdmission

DISABLED = Decision(Rule.DISABLED)
_CLIP = 80  # characters of a client-chosen name shown in a problem


def decide(request: AdmissionRequest, view: AdmissionView, settings: AuthzConfig) -> Decision:
    """The answer to one check. Never raises for any request content."""
    if not settings.enabled:
        return DISABLED
    name, from_header = _cluster_name(request, settings)
    cluster = view.clusters.get(name) if name else None
    probe = settings.probe_header_name in request.headers
    if probe and settings.probe_header == "deny":
        decision = cluster.probe_denied if cluster else view.probe_denied
    elif cluster is None:
        decision = _unresolved(name, from_header, settings)
    else:
        decision = _verdict(request, cluster, settings)
    if decision.allowed:
        decision = _adjust(decision, request, settings, probe)
    if request.header_bytes > settings.max_header_bytes and decision.problem is None:
        decision = replace(decision, problem=_oversized(request, settings))
    return decision


def _cluster_name(request: AdmissionRequest, settings: AuthzConfig) -> tuple[str, bool]:
    """(name, whether it came from the header); "" when none is given."""
    name = request.context_extensions.get(settings.cluster_key, "")
    if name:
        return name, False
    return request.headers.get(settings.cluster_header, "").strip(), True


def _unresolved(name: str, from_header: bool, settings: AuthzConfig) -> Decision:
    if not name:
        detail = (
            f"no cluster named: neither context_extensions[{settings.cluster_key}] "
            f"nor header {settings.cluster_header}; allowed"
        )
        return Decision(Rule.NO_CLUSTER, problem=Problem("no_cluster", detail))
    source = (
        f"header {settings.cluster_header}"
        if from_header
        else f"context_extensions[{settings.cluster_key}]"
    )
    detail = f"unknown cluster {_clip(name)} (from {source}); allowed"
    return Decision(Rule.UNKNOWN_CLUSTER, problem=Problem("unknown_cluster", detail))


def _verdict(
    request: AdmissionRequest, cluster: ClusterAdmission, settings: AuthzConfig
) -> Decision:
    if not cluster.warm:
        return cluster.cold
    capacity = cluster.capacity
    if not capacity.routable:
        return cluster.no_capacity
    priority = _priority(request.headers.get(settings.priority_header))
    if priority == "low" and capacity.ratio < settings.shed_below:
        return cluster.shed
    if priority == "high" and capacity.healthy:
        return cluster.routed
    return cluster.ok


def _priority(value: str | None) -> str:
    """ "low"/"high" (any case, spaces around ignored); anything else is no priority."""
    if value is None or len(value) > 16:
        return ""
    return value.strip().lower()


def _adjust(
    decision: Decision, request: AdmissionRequest, settings: AuthzConfig, probe: bool
) -> Decision:
    """The rare per-request header changes on top of a prebuilt allowing decision."""
    if probe:
        decision = replace(
            decision,
            remove_headers=(*decision.remove_headers, settings.probe_header_name),
            probe_stripped=True,
        )
    if settings.route_header in request.headers and decision.rule is not Rule.PRIORITY_ROUTED:
        # Overwrite rather than remove: Envoy re-matches the route (clear_route_cache) only
        # when a header is set, and the route was first matched on the client's value.
        unrouted = ((settings.route_header, UNROUTED_VALUE),)
        decision = replace(decision, set_headers=(*decision.set_headers, *unrouted))
    return decision


def _oversized(request: AdmissionRequest, settings: AuthzConfig) -> Problem:
    detail = (
        f"request headers total {request.header_bytes} bytes "
        f"(more than {settings.max_header_bytes}); answered normally"
    )
    return Problem("oversized_headers", detail)


def _clip(text: str) -> str:
    shown = text[:_CLIP]
    suffix = f"... ({len(text)} characters)" if len(text) > _CLIP else ""
    return repr(shown) + suffix
