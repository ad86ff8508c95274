"""The admission rules' settings in domain form (no pydantic): what ``authz:`` configures.

Built by ``llm_health.config.AuthzConfig.to_settings()``; tests build them directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ProbeHeaderMode = Literal["strip", "deny"]

#: Value written over a client-sent routing header when a request is NOT priority-routed,
#: so it cannot pick the HEALTHY-only route by itself (see ``AuthzSettings.route_header``).
UNROUTED_VALUE = "none"


@dataclass(frozen=True, slots=True)
class AuthzSettings:
    """Every header name is lower case: Envoy sends CheckRequest header keys lower-cased
    (service.auth.v3.AttributeContext.HttpRequest.headers) and the servicer lower-cases
    keys from other callers.

    - ``enabled``: False answers every Check with a plain OK (no header touched).
    - ``cluster_key``: the per-route ``check_settings.context_extensions`` key naming the
      cluster (ExtAuthzPerRoute); ``cluster_header`` is the fallback request header.
    - ``probe_header_name``: the probe marker (docs/design.md §2); ``probe_header`` what to do with a
      client request carrying it: "strip" (headers_to_remove) or "deny" (403).
    - ``shed_below``: capacity (0..1) under which ``priority_header: low`` gets 429.
    - ``route_header``/``route_value``: set on ``priority_header: high`` requests while the
      cluster has a HEALTHY endpoint; Envoy's route for it selects the
      ``envoy.lb/llm_health: healthy`` subset (needs ext_authz ``clear_route_cache``).
    - ``capacity_header``: added to allowed requests (and denials) with the capacity.
    - ``retry_after_s``: the ``Retry-After`` of 503 and 429 answers, whole seconds.
    - ``max_header_bytes``: a request whose headers add up to more is answered normally
      but reported as a problem (Envoy's own limit is 60 KiB by default).
    """

    enabled: bool = True
    cluster_key: str = "llm_cluster"
    cluster_header: str = "x-llm-cluster"
    probe_header: ProbeHeaderMode = "strip"
    probe_header_name: str = "x-llm-probe"
    shed_below: float = 0.5
    priority_header: str = "x-llm-priority"
    route_header: str = "x-llm-route"
    route_value: str = "healthy"
    capacity_header: str = "x-llm-capacity"
    retry_after_s: int = 1
    max_header_bytes: int = 64 * 1024
