"""The runtime layer for admission inside Envoy (llm_health.authz.native): pure.

Oracle: a cluster's shed key is 100 exactly when ``decide`` sheds a low-priority request
for it; Envoy answers every other case itself (its 503 when nothing is routable)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.authz import AdmissionRequest, AuthzConfig, Rule, build_view, decide
from llm_health.authz.native import shed_key, shed_layer
from llm_health.model.states import State
from tests.unit.authz.test_authz import NAME, D, H, U, cluster, snapshot

STATES = st.sampled_from(list(State))
LOW = AdmissionRequest({"x-llm-priority": "low"}, {"llm_cluster": NAME}, 0)


@settings(max_examples=300, deadline=None)
@given(
    states=st.lists(STATES, max_size=6),
    warm=st.booleans(),
    enabled=st.booleans(),
    shed_below=st.sampled_from([0.0, 0.3, 0.5, 0.77, 0.9, 1.0]),
)
def test_shed_key_is_100_exactly_when_decide_sheds_low_priority(
    states: list[State], warm: bool, enabled: bool, shed_below: float
) -> None:
    config = AuthzConfig(enabled=enabled, shed_below=shed_below)
    snap = snapshot(cluster(*states, warm=warm))
    sheds = decide(LOW, build_view(snap, config), config).rule is Rule.SHED
    assert shed_layer(snap, config) == {shed_key(NAME): 100 if sheds else 0}


@pytest.mark.parametrize(
    ("states", "warm", "expected"),
    [
        ((H, U, U), True, 100),  # capacity 0.33 < 0.5
        ((H, U), True, 0),  # 0.5 is not below 0.5
        ((D, D, D), True, 100),  # 0.3: DEGRADED keeps 30 %
        ((U, U), True, 0),  # nothing routable: Envoy's own 503, not a 429
        ((H, U, U), False, 0),  # not probed since start: nothing is known yet
        ((), True, 0),
    ],
)
def test_shed_cases(states: tuple[State, ...], warm: bool, expected: int) -> None:
    layer = shed_layer(snapshot(cluster(*states, warm=warm)), AuthzConfig())
    assert layer == {"llm_health.shed_low.llama-70b": expected}


def test_one_key_per_cluster_and_disabled_sheds_nothing() -> None:
    snap = snapshot(cluster(H, U, U), cluster(H, name="small"))
    assert shed_layer(snap, AuthzConfig()) == {shed_key(NAME): 100, shed_key("small"): 0}
    off = AuthzConfig(enabled=False)
    assert shed_layer(snap, off) == {shed_key(NAME): 0, shed_key("small"): 0}
