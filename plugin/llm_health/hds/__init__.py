"""Health Discovery Service: Envoys check endpoints from their side; their reports become
the board's "hds" signal (docs/design.md §5).

    settings   the ``hds:`` section (HdsConfig)
    assign     rendezvous hashing: which Envoys check which endpoint      (pure)
    ledger     folding reports: quorum, report TTL, first-check grace     (pure)
    fleet      connected Envoys, assignment, plans, reports                (pure)
    wire       HDS protobufs <-> the above
    service    the StreamHealthCheck engine over any request iterator

Only the pure parts are re-exported here (importing them loads no protobuf); the
engine is ``llm_health.hds.service``, the gRPC servicer ``llm_health.servers.hds``, the
component that feeds the board ``llm_health.hds.component``.
"""

from llm_health.hds.assign import Assignment, assign, checkers
from llm_health.hds.fleet import Fleet, NodePlan, ReportEntry, ReportTally
from llm_health.hds.ledger import Counted, Ledger, Reporter, Said
from llm_health.hds.settings import HdsConfig
from llm_health.model.states import EndpointKey

__all__ = [
    "Assignment",
    "Counted",
    "EndpointKey",
    "Fleet",
    "HdsConfig",
    "Ledger",
    "NodePlan",
    "ReportEntry",
    "ReportTally",
    "Reporter",
    "Said",
    "assign",
    "checkers",
]
