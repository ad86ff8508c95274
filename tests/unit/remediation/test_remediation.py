"""Remediation guardrails, the pure part (docs/design.md §13): when a hook is due, what the
limits refuse, argv templating."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llm_health.core.settings import MERGING
from llm_health.model.causes import Cause
from llm_health.model.states import State
from llm_health.remediation.decide import Candidate, Ledger, is_due, refusal
from llm_health.remediation.settings import LimitsConfig, RemediationConfig
from llm_health.remediation.template import render


def rule(for_s: float, causes: tuple[str, ...] = (), **action: object) -> RemediationConfig:
    when = {"state": "unhealthy", "for": for_s, "causes": causes}
    return RemediationConfig.model_validate({"when": when, **action}, context=MERGING)


RULE = rule(120.0, ("fatal", "timeout"), run=("/bin/true",))
LIMITS = LimitsConfig.model_validate(
    {"max_concurrent_per_cluster": 1, "cooldown": 600.0, "max_per_hour": 6}, context=MERGING
)
DUE = Candidate("c", "10.0.0.1:8000", State.UNHEALTHY, Cause.FATAL, 121.0, False, 10, 50)


@pytest.mark.parametrize(
    ("changes", "due"),
    [
        ({}, True),
        ({"in_state_s": 119.9}, False),  # not for long enough
        ({"state": State.STARTING, "cause": Cause.STARTUP_TIMEOUT}, False),
        ({"state": State.DEGRADED}, False),
        ({"cause": Cause.ERROR}, False),  # not one of the rule's causes
        ({"in_grace": True}, False),  # within startup_grace
    ],
)
def test_is_due(changes: dict[str, object], due: bool) -> None:
    assert is_due(RULE, replace(DUE, **changes)) is due  # type: ignore[arg-type]


def test_any_cause_when_the_rule_names_none() -> None:
    assert is_due(rule(120.0, run=("/bin/true",)), replace(DUE, cause=Cause.SIGNAL))


def test_once_then_cooldown() -> None:
    ledger = Ledger()
    assert refusal(ledger, DUE, RULE, LIMITS, 1000.0) is None
    ledger.start(DUE.key, RULE, 1000.0)
    assert refusal(ledger, DUE, RULE, LIMITS, 1001.0) == "already running"
    ledger.finish(DUE.key, RULE)
    assert refusal(ledger, DUE, RULE, LIMITS, 1599.0) == "cooldown (600 s)"
    assert refusal(ledger, DUE, RULE, LIMITS, 1600.0) is None
    # An escalation rule (another rule) has its own cooldown.
    rebuild = rule(300.0, webhook="https://ops.example/rebuild")
    assert refusal(ledger, DUE, rebuild, LIMITS, 1001.0) is None


def test_concurrency_and_ejection_limits_per_cluster() -> None:
    ledger = Ledger()
    ledger.start(("c", "10.0.0.9:8000"), RULE, 0.0)
    assert refusal(ledger, DUE, RULE, LIMITS, 1.0) == "max_concurrent_per_cluster (1)"
    other_cluster = replace(DUE, cluster="d")
    assert refusal(ledger, other_cluster, RULE, LIMITS, 1.0) is None
    wide = LIMITS.model_copy(update={"max_concurrent_per_cluster": 10})
    small = replace(DUE, cluster_size=3, max_ejection_percent=50)  # 1 of 3 at most
    assert refusal(ledger, small, RULE, wide, 1.0) == "max_ejection_percent (50 % of 3)"
    big = replace(DUE, cluster_size=10, max_ejection_percent=50)  # 5 of 10
    assert refusal(ledger, big, RULE, wide, 1.0) is None


def test_max_per_hour_over_every_endpoint() -> None:
    ledger = Ledger()
    wide = LIMITS.model_copy(update={"max_concurrent_per_cluster": 100, "max_per_hour": 2})
    for index in range(2):
        ledger.start(("c", f"10.0.0.{index + 10}:8000"), RULE, float(index))
        ledger.finish(("c", f"10.0.0.{index + 10}:8000"), RULE)
    ledger.forget_before(100.0)
    assert refusal(ledger, DUE, RULE, wide, 100.0) == "max_per_hour (2)"
    ledger.forget_before(3601.5)
    assert refusal(ledger, DUE, RULE, wide, 3601.5) is None


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("/x", "{cluster}", "{address}"), ["/x", "c", "[::1]:8000"]),
        (("/x", "--host={host}", "{port}"), ["/x", "--host=::1", "8000"]),
        (
            ("/x", "{0.__class__}", "{unknown}", "{{cluster}}"),
            ["/x", "{0.__class__}", "{unknown}", "{c}"],
        ),
        (("/x", "$(rm -rf /); {state}"), ["/x", "$(rm -rf /); unhealthy"]),
    ],
)
def test_render_is_plain_substitution(argv: tuple[str, ...], expected: list[str]) -> None:
    values = {
        "cluster": "c",
        "address": "[::1]:8000",
        "host": "::1",
        "port": "8000",
        "state": "unhealthy",
    }
    assert render(argv, values) == expected
