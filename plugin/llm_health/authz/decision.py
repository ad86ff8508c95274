"""What an admission check is asked and what it answers, in domain words (no protobuf).

``AdmissionRequest`` is what the servicer translates a CheckRequest into; ``Decision`` is
what it translates back into a CheckResponse (OK with header changes, or a denial that
Envoy answers itself). Decisions are immutable and mostly prebuilt per snapshot
(``llm_health.authz.view``), so a check allocates next to nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

Headers = tuple[tuple[str, str], ...]
_EMPTY: Mapping[str, str] = MappingProxyType({})
#: A kind of request problem already logged: again at most this often (``core.problems``).
PROBLEM_LOG_EVERY_S = 10.0
PROBLEM_MESSAGE = "ext_authz request problem"


class Rule(enum.Enum):
    """The rule that decided a check (a counter label: keep the set small and fixed)."""

    OK = "ok"  # allowed, x-llm-capacity added
    PRIORITY_ROUTED = "priority_routed"  # allowed, routed to the HEALTHY subset
    NO_CAPACITY = "no_capacity"  # 503: no HEALTHY or DEGRADED endpoint
    SHED = "shed"  # 429: low priority while capacity < shed_below
    PROBE_DENIED = "probe_denied"  # 403: client sent the probe header (mode deny)
    COLD = "cold"  # allowed untouched: cluster not fully probed since start (docs/design.md §7)
    UNKNOWN_CLUSTER = "unknown_cluster"  # allowed untouched: cluster not in the config
    NO_CLUSTER = "no_cluster"  # allowed untouched: no cluster named at all
    DISABLED = "disabled"  # allowed untouched: authz.enabled is false


@dataclass(frozen=True, slots=True)
class Problem:
    """Something odd about a request, for a (rate-limited) log line. ``kind`` is one of a
    few fixed words (no_cluster, unknown_cluster, oversized_headers); ``detail`` is clipped
    and never carries a header value other than the cluster name."""

    kind: str
    detail: str

    def log_fields(self, cluster: str | None) -> dict[str, str | None]:
        """The fields of its log line (``PROBLEM_MESSAGE``); ``cluster``: the decision's."""
        return {"problem": self.kind, "detail": self.detail, "cluster": cluster}


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """One request as the rules see it.

    ``headers``: request headers, names lower case (values as sent; a repeated header is
    one comma-joined value, as Envoy sends it). ``context_extensions``: the route's
    ``check_settings.context_extensions``. ``header_bytes``: total size of names and
    values, for the oversized-headers report.
    """

    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    context_extensions: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    header_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one check.

    ``status`` 200 allows the request: Envoy then sets ``set_headers`` (overwriting) and
    removes ``remove_headers`` on the request before routing it. Any other status is a
    denial: Envoy answers the client itself with that status, ``reply_headers`` and
    ``body``, and the backends never see the request. ``cluster`` is the configured cluster
    the request targets (None when none or an unknown one was named).
    """

    rule: Rule
    cluster: str | None = None
    status: int = 200
    set_headers: Headers = ()
    remove_headers: tuple[str, ...] = ()
    reply_headers: Headers = ()
    body: str = ""
    probe_stripped: bool = False
    problem: Problem | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200
