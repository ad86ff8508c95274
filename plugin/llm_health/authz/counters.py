"""Admission counters: every decision by cluster and rule, problems, errors, latency.

A plain dataclass (no Prometheus here): ``as_dict()`` is the /status part and the
source a metrics exporter reads. Cardinality is bounded: clusters are the configured
ones plus ``(none)`` and ``(unknown)``; rules and problem kinds are fixed sets.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from llm_health.authz.decision import Decision, Rule

NO_CLUSTER = "(none)"
UNKNOWN_CLUSTER = "(unknown)"
#: Upper bounds (seconds) of the check-latency histogram, as Prometheus ``le`` buckets.
LATENCY_BUCKETS_S = (0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025)


def _nested() -> defaultdict[str, defaultdict[str, int]]:
    return defaultdict(lambda: defaultdict(int))


@dataclass(frozen=True, slots=True)
class CountersState:
    """``AuthzCounters`` as plain data, at one moment."""

    checks: int = 0
    decisions: dict[str, dict[str, int]] = field(default_factory=dict)
    probe_headers_stripped: int = 0
    problems: dict[str, int] = field(default_factory=dict)
    internal_errors: int = 0
    latency_counts: tuple[int, ...] = ()
    latency_sum_s: float = 0.0


@dataclass
class AuthzCounters:
    """Mutated on the event loop only, or under the ext_authz component's lock when its
    own threads serve (``server.authz``). ``latency`` is the time the plugin spent on one
    Check (translation, decision, response), not the network round trip."""

    checks: int = 0
    decisions: defaultdict[str, defaultdict[str, int]] = field(default_factory=_nested)
    probe_headers_stripped: int = 0
    problems: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    internal_errors: int = 0
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    latency_sum_s: float = 0.0

    def count(self, decision: Decision, elapsed_s: float) -> None:
        self.checks += 1
        self.decisions[_cluster_label(decision)][decision.rule.value] += 1
        self.probe_headers_stripped += decision.probe_stripped
        if decision.problem is not None:
            self.problems[decision.problem.kind] += 1
        self.observe(elapsed_s)

    def observe(self, elapsed_s: float) -> None:
        index = 0
        while index < len(LATENCY_BUCKETS_S) and elapsed_s > LATENCY_BUCKETS_S[index]:
            index += 1
        self.latency_counts[index] += 1
        self.latency_sum_s += elapsed_s

    def state(self) -> CountersState:
        """Plain data (no defaultdict factories): what the admission process sends back."""
        return CountersState(
            self.checks,
            {c: dict(rules) for c, rules in self.decisions.items()},
            self.probe_headers_stripped,
            dict(self.problems),
            self.internal_errors,
            tuple(self.latency_counts),
            self.latency_sum_s,
        )

    def add(self, other: CountersState) -> None:
        """Add ``other``'s counts to these (a restarted process's counts start at 0 again:
        its last report is added to a base, so what /metrics shows never goes down)."""
        self.checks += other.checks
        for cluster, rules in other.decisions.items():
            for rule, count in rules.items():
                self.decisions[cluster][rule] += count
        self.probe_headers_stripped += other.probe_headers_stripped
        for kind, count in other.problems.items():
            self.problems[kind] += count
        self.internal_errors += other.internal_errors
        for index, count in enumerate(other.latency_counts[: len(self.latency_counts)]):
            self.latency_counts[index] += count
        self.latency_sum_s += other.latency_sum_s

    def as_dict(self) -> dict[str, Any]:
        cumulative, running = {}, 0
        for bound, count in zip(
            (*LATENCY_BUCKETS_S, float("inf")), self.latency_counts, strict=True
        ):
            running += count
            cumulative["+Inf" if bound == float("inf") else f"{bound:g}"] = running
        return {
            "checks": self.checks,
            "decisions": {c: dict(rules) for c, rules in sorted(self.decisions.items())},
            "probe_headers_stripped": self.probe_headers_stripped,
            "problems": dict(self.problems),
            "internal_errors": self.internal_errors,
            "latency_s": {
                "buckets": cumulative,
                "sum": round(self.latency_sum_s, 6),
                "count": running,
            },
        }


def _cluster_label(decision: Decision) -> str:
    if decision.cluster is not None:
        return decision.cluster
    return UNKNOWN_CLUSTER if decision.rule is Rule.UNKNOWN_CLUSTER else NO_CLUSTER
