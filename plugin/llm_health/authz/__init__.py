"""ext_authz admission (docs/design.md §5.3): decide from in-memory health whether Envoy lets a request
through, and how. Pure decisions, no grpc/protobuf here (``servers.authz`` translates).

    AdmissionRequest --decide(request, view, settings)--> Decision
    HealthSnapshot  --build_view(snapshot, settings)-->  AdmissionView (once per revision)
    Gate: the two glued to the hub's current snapshot; AuthzCounters: bookkeeping.

A decision's ``Problem`` is logged through ``core.problems`` (``PROBLEM_MESSAGE``, at
most once per ``PROBLEM_LOG_EVERY_S`` per kind).

``settings``: the ``authz:`` section (``AuthzConfig``). ``component`` (not re-exported
here: it loads grpc) serves ``Check`` and reports the counters.
"""

from llm_health.authz.counters import AuthzCounters, CountersState
from llm_health.authz.decide import decide
from llm_health.authz.decision import (
    PROBLEM_LOG_EVERY_S,
    PROBLEM_MESSAGE,
    AdmissionRequest,
    Decision,
    Problem,
    Rule,
)
from llm_health.authz.gate import Checker, Gate, PushedGate
from llm_health.authz.settings import AuthzConfig, ProbeHeaderMode
from llm_health.authz.view import (
    AdmissionView,
    Capacity,
    ClusterAdmission,
    ClusterFacts,
    build_view,
    cluster_capacity,
    cluster_facts,
    view_from_facts,
)

__all__ = [
    "PROBLEM_LOG_EVERY_S",
    "PROBLEM_MESSAGE",
    "AdmissionRequest",
    "AdmissionView",
    "AuthzConfig",
    "AuthzCounters",
    "Capacity",
    "Checker",
    "ClusterAdmission",
    "ClusterFacts",
    "CountersState",
    "Decision",
    "Gate",
    "ProbeHeaderMode",
    "Problem",
    "PushedGate",
    "Rule",
    "build_view",
    "cluster_capacity",
    "cluster_facts",
    "decide",
    "view_from_facts",
]
