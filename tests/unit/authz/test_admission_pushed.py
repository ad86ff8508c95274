"""What crosses to the admission process (``server.authz_isolation: process``,
docs/design.md §16.9): cluster facts instead of the snapshot, counters as plain data, a
gate fed whole views, and when the runtime sends one. No process, no network."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_health.authz import (
    AuthzCounters,
    CountersState,
    PushedGate,
    Rule,
    build_view,
    cluster_facts,
    view_from_facts,
)
from llm_health.authz.component.pipe import ChildInit
from llm_health.authz.component.process import AdmissionProcess
from llm_health.core.hub import SnapshotHub
from llm_health.model.states import State
from llm_health.probe.wire import FrameReader, Outbox
from llm_health.servers.auth import GrpcSecurity, PortSecrets
from tests.unit.authz.test_authz import DEFAULT, NAME, cluster, req, run, snapshot

H, D, U = State.HEALTHY, State.DEGRADED, State.UNHEALTHY
STATES = st.sampled_from([H, D, U, State.STARTING, State.DRAINING])


@given(
    st.lists(st.lists(STATES, max_size=6), min_size=1, max_size=4),
    st.lists(st.booleans(), min_size=4, max_size=4),
    st.integers(0, 2**40),
)
def test_a_view_from_facts_is_the_view_from_the_snapshot(
    states: list[list[State]], warm: list[bool], revision: int
) -> None:
    clusters = [cluster(*s, warm=warm[i], name=f"c{i}") for i, s in enumerate(states)]
    whole = snapshot(*clusters, revision=revision)
    for settings in (DEFAULT, DEFAULT.model_copy(update={"shed_below": 0.9})):
        facts = pickle.loads(pickle.dumps(cluster_facts(whole)))  # as it crosses the pipe
        assert view_from_facts(revision, facts, settings) == build_view(whole, settings)


def test_the_pushed_gate_answers_nothing_before_its_first_view() -> None:
    gate = PushedGate()
    assert not gate.has_view
    with pytest.raises(RuntimeError, match="no admission view"):
        gate.check(req())


def test_each_view_replaces_the_last_whole() -> None:
    gate = PushedGate()
    gate.update(1, cluster_facts(snapshot(cluster(H))), DEFAULT)
    assert gate.has_view and gate.check(req()).rule is Rule.OK
    gate.update(2, cluster_facts(snapshot(cluster(U), revision=2)), DEFAULT)
    assert gate.check(req()).rule is Rule.NO_CAPACITY
    gate.update(3, (), DEFAULT)  # the cluster is gone from the board
    assert gate.check(req()).rule is Rule.UNKNOWN_CLUSTER
    gate.update(4, (), DEFAULT.model_copy(update={"enabled": False}))
    assert gate.check(req()).rule is Rule.DISABLED
    assert gate.rebuilds == 4


def counted() -> AuthzCounters:
    counters = AuthzCounters()
    counters.count(run(req(), H), 0.000_03)
    counters.count(run(req(), U), 0.003)
    counters.count(run(req(cluster_name=None), H), 0.0)
    counters.count(run(req({"x-llm-probe": "1"}), H), 0.000_2)
    return counters


def test_counters_cross_as_plain_data_and_add_up() -> None:
    one = counted()
    state = pickle.loads(pickle.dumps(one.state()))
    assert isinstance(state, CountersState)
    total = AuthzCounters()
    total.add(state)
    assert total.as_dict() == one.as_dict()
    total.add(counted().state())  # a restarted process: its counts are added, not replacing
    doubled = total.as_dict()
    assert doubled["checks"] == 8
    assert doubled["decisions"][NAME] == {"ok": 4, "no_capacity": 2}
    assert doubled["decisions"]["(none)"] == {"no_cluster": 2}
    assert doubled["probe_headers_stripped"] == 2
    assert doubled["latency_s"]["count"] == 8
    assert doubled["latency_s"]["sum"] == pytest.approx(2 * one.as_dict()["latency_s"]["sum"])


def test_the_state_is_a_copy_not_a_view_of_the_live_counters() -> None:
    live = counted()
    state = live.state()
    live.count(run(req(), H), 0.0)
    assert state.checks == 4 and state.decisions[NAME]["ok"] == 2


def test_no_secret_shows_in_what_is_logged_of_the_init() -> None:
    secrets = PortSecrets("token-0123456789abcdef", b"CERT-BYTES", b"KEY-BYTES", b"CA-BYTES")
    init = ChildInit("127.0.0.1:9", secrets)
    shown = repr(init) + str(init) + repr(secrets)
    for secret in ("token-0123456789abcdef", "CERT-BYTES", "KEY-BYTES", "CA-BYTES"):
        assert secret not in shown
    assert pickle.loads(pickle.dumps(init)) == init  # it still crosses whole


async def test_the_runtime_sends_a_view_only_for_new_facts_or_new_settings() -> None:
    """``AdmissionProcess.send_view`` (the runtime's side, no process started): a poll
    that finds the same snapshot and settings sends nothing; new settings (a reload) or
    new facts do; a new revision with the same facts does not."""
    hub = SnapshotHub(snapshot(cluster(H), revision=1))
    live = {"settings": DEFAULT}
    process = AdmissionProcess("127.0.0.1:9", hub, lambda: live["settings"], GrpcSecurity)
    sent: list[bytes] = []
    pipe = Outbox(sent.append)

    def views() -> list[tuple[int, bool]]:
        pipe.flush()
        found = [m for data in sent for batch in FrameReader().feed(data) for m in batch]
        sent.clear()
        return [(m[1], m[3].enabled) for m in found if m[0] == "view"]

    assert process.send_view(pipe) == 1 and views() == [(1, True)]
    assert process.send_view(pipe) == 1 and views() == []  # nothing new
    live["settings"] = DEFAULT.model_copy(update={"enabled": False})  # a reload
    assert process.send_view(pipe) == 1 and views() == [(1, False)]
    hub.put(snapshot(cluster(H), revision=2))  # same facts
    assert process.send_view(pipe) == 2 and views() == []
    hub.put(snapshot(cluster(U), revision=3))
    assert process.send_view(pipe) == 3 and views() == [(3, False)]
