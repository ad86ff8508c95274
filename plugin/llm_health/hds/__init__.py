"""Health Discovery Service: Envoys check endpoints from their side; their reports become
the board's "hds" signal (docs/design.md §5).

    settings   what ``hds:`` configures (CheckSpec, HdsSettings)
    assign     rendezvous hashing: which Envoys check which endpoint      (pure)
    ledger     folding reports: quorum, report TTL, first-check grace     (pure)
    fleet      connected Envoys, assignment, plans, reports                (pure)
    wire       HDS protobufs <-> the above
    service    the StreamHealthCheck engine over any request iterator

Only the pure parts are re-exported here (importing them loads no protobuf); the
engine is ``llm_health.hds.service``. The gRPC servicer is ``llm_health.servers.hds``; the wiring ``llm_health.app.hds``.
"""

from llm_health.hds.assign import Assignment, assign, checkers
from llm_health.hds.fleet import Fleet, NodePlan, ReportEntry, ReportTally
from llm_health.hds.ledger import Counted, Ledger, Reporter, Said
from llm_health.hds.settings import CheckSpec, HdsSettings
from llm_health.model.states import EndpointKey

__all__ = [
    "Assignment",
    "CheckSpec",
    "Counted",
    "EndpointKey",
    "Fleet",
    "HdsSettings",
    "Ledger",
    "NodePlan",
    "ReportEntry",
    "ReportTally",
    "Reporter",
    "Said",
    "assign",
    "checkers",
]
