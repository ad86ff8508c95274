"""``authz:``: the ext_authz admission section of the config (docs/design.md §5.3),
validated here and read as it is by the admission rules.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, model_validator

from llm_health.core.settings import Duration, Frozen, Number

ProbeHeaderMode = Literal["strip", "deny"]

#: Value written over a client-sent routing header when a request is NOT priority-routed,
#: so it cannot pick the HEALTHY-only route by itself (see ``AuthzConfig.route_header``).
UNROUTED_VALUE = "none"


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


HeaderName = Annotated[
    str, BeforeValidator(_lower), Field(max_length=100, pattern=r"^[a-z0-9!#$%&'*+.^_`|~-]+$")
]


class AuthzConfig(Frozen):
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
    - ``retry_after``: the ``Retry-After`` of 503 and 429 answers (``retry_after_s``).
    - ``max_header_bytes`` (not configurable): a request whose headers add up to more is
      answered normally but reported as a problem (Envoy's own limit is 60 KiB by default).
    """

    max_header_bytes: ClassVar[int] = 64 * 1024

    enabled: bool = True
    cluster_key: str = Field("llm_cluster", min_length=1, max_length=100)
    cluster_header: HeaderName = "x-llm-cluster"
    probe_header: ProbeHeaderMode = "strip"
    probe_header_name: HeaderName = "x-llm-probe"
    shed_below: Number = Field(0.5, ge=0, le=1)
    priority_header: HeaderName = "x-llm-priority"
    route_header: HeaderName = "x-llm-route"
    route_value: str = Field("healthy", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    capacity_header: HeaderName = "x-llm-capacity"
    retry_after: Duration = 1.0

    @model_validator(mode="after")
    def _distinct(self) -> AuthzConfig:
        names = [self.cluster_header, self.probe_header_name, self.priority_header]
        names += [self.route_header, self.capacity_header]
        if len(set(names)) != len(names):
            raise ValueError("the authz header names must all differ")
        if self.route_value == UNROUTED_VALUE:
            raise ValueError(f'route_value "{UNROUTED_VALUE}" is reserved')
        return self

    @property
    def retry_after_s(self) -> int:
        """``retry_after`` in whole seconds, rounded up (a header value: at least 1)."""
        return max(1, math.ceil(self.retry_after))
