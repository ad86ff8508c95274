"""Pure xDS stream rules (llm_health.xds.protocol): table-driven, no gRPC, no event loop."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from llm_health.model.board import ClusterSnapshot, HealthSnapshot
from llm_health.xds.protocol import (
    DeltaState,
    RequestKind,
    SotwState,
    Subscription,
    classify,
    delta_subscription,
    interest,
    select,
    set_version,
    sotw_needs_push,
    sotw_subscription,
)
from llm_health.xds.stream import KIND_TYPES
from llm_health.xds.tally import REPEAT_LOG_S, ProblemTally

K = RequestKind


def snap(revision: int = 1, **clusters: str | tuple[str, bool]) -> HealthSnapshot:
    """``snap(a="v1", b=("v2", False))``: cluster a warm at v1, cluster b cold at v2."""
    built = {}
    for name, spec in clusters.items():
        version, warm = (spec, True) if isinstance(spec, str) else spec
        built[name] = ClusterSnapshot(name, (), warm, version)
    return HealthSnapshot(revision, built)


# --------------------------------------------------------------------------- classify


@pytest.mark.parametrize(
    ("first", "nonce", "error", "latest", "awaiting", "expected"),
    [
        (True, "", False, "", (), K.INITIAL),
        (True, "7", False, "", (), K.INITIAL),  # a nonce from an old stream: still initial
        (False, "", False, "3", ("3",), K.UPDATE),  # spontaneous, before our response landed
        (False, "3", False, "3", ("3",), K.ACK),
        (False, "3", True, "3", ("3",), K.NACK),
        (False, "2", False, "3", ("3",), K.STALE),  # superseded by nonce 3
        (False, "2", True, "3", ("3",), K.STALE),  # a NACK of a superseded response
        (False, "garbage", False, "3", ("3",), K.STALE),
        (False, "garbage", False, "", (), K.UPDATE),  # nothing sent: nothing can be stale
        (False, "3", False, "3", (), K.UPDATE),  # latest nonce again after its ACK
        (False, "2", False, "3", ("2", "3"), K.ACK),  # delta: older unanswered response
        (False, "2", True, "3", ("2", "3"), K.NACK),
    ],
)
def test_classify(
    first: bool, nonce: str, error: bool, latest: str, awaiting: tuple[str, ...], expected: K
) -> None:
    kind = classify(
        first=first,
        response_nonce=nonce,
        has_error=error,
        latest_nonce=latest,
        awaiting=awaiting,
    )
    assert kind is expected


# --------------------------------------------------------------------------- subscriptions


NONE = Subscription()


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # spec "How the client specifies what resources to return", SotW example
        ([[]], Subscription(frozenset(), wildcard=True, explicit=False)),
        ([[], ["*", "A"]], Subscription(frozenset({"A"}), wildcard=True, explicit=True)),
        ([[], ["*", "A"], ["A"]], Subscription(frozenset({"A"}), wildcard=False, explicit=True)),
        ([[], ["*", "A"], ["A"], []], Subscription(frozenset(), wildcard=False, explicit=True)),
        ([["A", "B"]], Subscription(frozenset({"A", "B"}), wildcard=False, explicit=True)),
        ([["A", "B"], ["A"]], Subscription(frozenset({"A"}), wildcard=False, explicit=True)),
        ([[], []], Subscription(frozenset(), wildcard=True, explicit=False)),
    ],
)
def test_sotw_subscription(steps: list[list[str]], expected: Subscription) -> None:
    subscription = NONE
    for names in steps:
        subscription = sotw_subscription(subscription, names)
    assert subscription == expected


@pytest.mark.parametrize(
    ("steps", "names", "wildcard"),
    [
        # spec "How the client specifies what resources to return", incremental example
        ([([], [])], set(), True),
        ([([], []), (["A"], [])], {"A"}, True),
        ([([], []), (["A"], []), ([], ["*"])], {"A"}, False),
        ([([], []), (["A"], []), ([], ["*"]), ([], ["A"])], set(), False),
        ([(["A", "B"], [])], {"A", "B"}, False),
        ([(["A", "B"], []), ([], ["B", "ghost"])], {"A"}, False),  # phantom unsubscribe: fine
        ([(["A"], []), ([], [])], {"A"}, False),  # empty later request: no legacy wildcard
        ([(["*"], [])], set(), True),
    ],
)
def test_delta_subscription(
    steps: list[tuple[list[str], list[str]]], names: set[str], wildcard: bool
) -> None:
    subscription = NONE
    for index, (subscribe, unsubscribe) in enumerate(steps):
        subscription = delta_subscription(
            subscription, first=index == 0, subscribe=subscribe, unsubscribe=unsubscribe
        )
    assert (subscription.names, subscription.wildcard) == (names, wildcard)


def test_interest_adds_everything_available_only_for_wildcard() -> None:
    named = Subscription(frozenset({"a"}), wildcard=False, explicit=True)
    assert interest(named, ["a", "b"]) == {"a"}
    assert interest(Subscription(frozenset({"z"}), wildcard=True), ["a", "b"]) == {"a", "b", "z"}


# --------------------------------------------------------------------------- selection


@pytest.mark.parametrize(
    ("wanted", "ready", "cold", "missing"),
    [
        (["a"], ["a"], [], []),
        (["b", "a"], ["a"], ["b"], []),
        (["a", "nope"], ["a"], [], ["nope"]),
        ([], [], [], []),
    ],
)
def test_select(wanted: list[str], ready: list[str], cold: list[str], missing: list[str]) -> None:
    selection = select(wanted, snap(a="v1", b=("v2", False)))
    assert [c.name for c in selection.ready] == ready
    assert list(selection.cold) == cold
    assert list(selection.missing) == missing


def test_set_version_is_order_independent_and_content_sensitive() -> None:
    assert set_version({"a": "1", "b": "2"}) == set_version({"b": "2", "a": "1"})
    assert set_version({"a": "1", "b": "2"}) != set_version({"a": "1", "b": "3"})
    assert set_version({"a": "1"}) != set_version({"a": "1", "b": "2"})


@pytest.mark.parametrize(
    ("version", "client", "sent", "nacked", "expected"),
    [
        ("v2", "", "", "", True),  # first push
        ("v2", "v2", "v2", "", False),  # ACKed
        ("v2", "", "v2", "", False),  # in flight, not answered yet
        ("v2", "v1", "v2", "v2", False),  # NACKed: never resent
        ("v3", "v1", "v2", "v2", True),  # the state changed after the NACK
        ("v2", "v2", "", "", False),  # reconnect: the client already has it
    ],
)
def test_sotw_needs_push(version: str, client: str, sent: str, nacked: str, expected: bool) -> None:
    assert sotw_needs_push(version, client=client, sent=sent, nacked=nacked) is expected


# --------------------------------------------------------------------------- SotW scripts


@dataclass
class Req:
    names: Sequence[str] = ("a",)
    nonce: str = ""
    version: str = ""
    error: str | None = None
    kind: K | None = None  # expected classification, when checked


@dataclass
class Push:
    """Expect a plan against ``snapshot``: ``names`` pushed (None: no push)."""

    snapshot: HealthSnapshot
    names: Sequence[str] | None
    unknown: Sequence[str] = field(default_factory=tuple)


def run_sotw(steps: Sequence[Req | Push]) -> SotwState:
    """Play ``steps``; every push is answered by nothing unless a later Req says so.
    ``nonce="last"``/``version="last"`` refer to the latest push."""
    state = SotwState()
    for step in steps:
        if isinstance(step, Req):
            nonce = state.last_nonce if step.nonce == "last" else step.nonce
            version = state.sent_version if step.version == "last" else step.version
            outcome = state.on_request(
                version_info=version,
                resource_names=step.names,
                response_nonce=nonce,
                error=step.error,
            )
            if step.kind is not None:
                assert outcome.kind is step.kind, step
        else:
            plan = state.plan(step.snapshot)
            pushed = None if plan.push is None else [c.name for c in plan.push.clusters]
            assert pushed == (None if step.names is None else list(step.names)), step
            assert list(plan.unknown) == list(step.unknown), step
    return state


S1 = snap(1, a="a1", b="b1")
S2 = snap(2, a="a2", b="b1")
S3 = snap(3, a="a3", b="b1")

SOTW_SCRIPTS: dict[str, list[Req | Push]] = {
    "initial request is answered": [Req(kind=K.INITIAL), Push(S1, ["a"])],
    "no request, no push": [Push(S1, None)],
    "ACK is never answered": [
        Req(),
        Push(S1, ["a"]),
        Req(nonce="last", version="last", kind=K.ACK),
        Push(S1, None),
    ],
    "in-flight response is not repeated before its ACK": [Req(), Push(S1, ["a"]), Push(S1, None)],
    "state change pushes again": [
        Req(),
        Push(S1, ["a"]),
        Req(nonce="last", version="last"),
        Push(S2, ["a"]),
    ],
    "change of an unrequested cluster pushes nothing": [
        Req(),
        Push(S1, ["a"]),
        Req(nonce="last", version="last"),
        Push(snap(2, a="a1", b="b9"), None),
    ],
    "NACK: no resend until the state changes": [
        Req(),
        Push(S1, ["a"]),
        Req(nonce="last", version="", error="bad weight", kind=K.NACK),
        Push(S1, None),
        Push(S2, ["a"]),
    ],
    "NACK with an empty error_detail message is still a NACK": [
        Req(),
        Push(S1, ["a"]),
        Req(nonce="last", error="", kind=K.NACK),
        Push(S1, None),
    ],
    "subscription change is answered with the new full set": [
        Req(),
        Push(S1, ["a"]),
        Req(names=["a", "b"], nonce="last", version="last", kind=K.ACK),
        Push(S1, ["a", "b"]),
    ],
    "stale request changes nothing": [
        Req(),
        Push(S1, ["a"]),
        Req(nonce="last", version="last"),
        Push(S2, ["a"]),  # nonce 2
        Req(names=["a", "b"], nonce="1", kind=K.STALE),
        Push(S2, None),
    ],
    "garbage nonce after a push is stale, stream keeps working": [
        Req(),
        Push(S1, ["a"]),
        Req(nonce="zzz", error="x", kind=K.STALE),
        Req(nonce="last", version="last", kind=K.ACK),
        Push(S2, ["a"]),
    ],
    "garbage nonce on the first request": [Req(nonce="zzz", kind=K.INITIAL), Push(S1, ["a"])],
    "reconnect with the current version: nothing to send": [
        Req(version=set_version({"a": "a1"}), kind=K.INITIAL),
        Push(S1, None),
        Push(S2, ["a"]),
    ],
    "unknown cluster is ignored and reported once": [
        Req(names=["a", "ghost"]),
        Push(S1, ["a"], unknown=["ghost"]),
        Req(names=["a", "ghost"], nonce="last", version="last"),
        Push(S2, ["a"]),
    ],
    "only unknown clusters: no push": [Req(names=["ghost"]), Push(S1, None, unknown=["ghost"])],
    "cold cluster is held until warm": [
        Req(names=["a", "b"]),
        Push(snap(1, a="a1", b=("b1", False)), ["a"]),
        Req(names=["a", "b"], nonce="last", version="last"),
        Push(snap(2, a="a1", b=("b1", False)), None),
        Push(snap(3, a="a1", b="b1"), ["a", "b"]),
    ],
    "wildcard (legacy empty names) gets every warm cluster": [
        Req(names=[]),
        Push(snap(1, a="a1", b="b1", c=("c1", False)), ["a", "b"]),
    ],
}


@pytest.mark.parametrize("script", SOTW_SCRIPTS.values(), ids=SOTW_SCRIPTS.keys())
def test_sotw_script(script: list[Req | Push]) -> None:
    run_sotw(script)


def test_sotw_nonces_are_a_per_stream_counter_and_version_is_the_set_hash() -> None:
    state = SotwState()
    state.on_request(version_info="", resource_names=["a", "b"], response_nonce="", error=None)
    first = state.plan(S1).push
    assert first is not None
    assert (first.nonce, first.version) == ("1", set_version({"a": "a1", "b": "b1"}))
    state.on_request(
        version_info=first.version, resource_names=["a", "b"], response_nonce="1", error=None
    )
    second = state.plan(S2).push
    assert second is not None and second.nonce == "2" and second.version != first.version


def test_sotw_nack_outcome_carries_error_and_rejected_version() -> None:
    state = SotwState()
    state.on_request(version_info="", resource_names=["a"], response_nonce="", error=None)
    push = state.plan(S1).push
    assert push is not None
    outcome = state.on_request(
        version_info="", resource_names=["a"], response_nonce=push.nonce, error="weight 0"
    )
    assert (outcome.kind, outcome.error, outcome.rejected) == (
        K.NACK,
        "weight 0",
        f"version {push.version}",
    )


# --------------------------------------------------------------------------- delta scripts


@dataclass
class DReq:
    sub: Sequence[str] = ()
    unsub: Sequence[str] = ()
    initial: dict[str, str] = field(default_factory=dict)
    nonce: str = ""
    error: str | None = None
    kind: K | None = None


@dataclass
class DPush:
    """Expect a delta plan: ``sent`` names (with the snapshot's versions) and ``removed``."""

    snapshot: HealthSnapshot
    sent: Sequence[str] = ()
    removed: Sequence[str] = ()
    unknown: Sequence[str] = ()


def run_delta(steps: Sequence[DReq | DPush]) -> DeltaState:
    state = DeltaState()
    for step in steps:
        if isinstance(step, DReq):
            nonce = state.last_nonce if step.nonce == "last" else step.nonce
            outcome = state.on_request(
                subscribe=step.sub,
                unsubscribe=step.unsub,
                initial_versions=step.initial,
                response_nonce=nonce,
                error=step.error,
            )
            if step.kind is not None:
                assert outcome.kind is step.kind, step
        else:
            plan = state.plan(step.snapshot)
            sent = [] if plan.push is None else [c.name for c in plan.push.clusters]
            removed = [] if plan.push is None else list(plan.push.removed)
            assert (sent, removed) == (list(step.sent), list(step.removed)), step
            assert list(plan.unknown) == list(step.unknown), step
    return state


DELTA_SCRIPTS: dict[str, list[DReq | DPush]] = {
    "subscribe sends the resources": [DReq(sub=["a", "b"], kind=K.INITIAL), DPush(S1, ["a", "b"])],
    "ACK is never answered": [
        DReq(sub=["a", "b"]),
        DPush(S1, ["a", "b"]),
        DReq(nonce="last", kind=K.ACK),
        DPush(S1),
    ],
    "only the changed resource is sent": [
        DReq(sub=["a", "b"]),
        DPush(S1, ["a", "b"]),
        DReq(nonce="last"),
        DPush(S2, ["a"]),
    ],
    "sent but not yet ACKed is not repeated": [DReq(sub=["a"]), DPush(S1, ["a"]), DPush(S1)],
    "initial_resource_versions: current ones are not resent": [
        DReq(sub=["a", "b"], initial={"a": "a1", "b": "old"}),
        DPush(S1, ["b"]),
    ],
    "initial_resource_versions: vanished cluster is removed": [
        DReq(sub=["a", "gone"], initial={"a": "a1", "gone": "g1"}),
        DPush(S1, [], ["gone"]),
    ],
    "unsubscribe needs no answer; resubscribe resends": [
        DReq(sub=["a", "b"]),
        DPush(S1, ["a", "b"]),
        DReq(unsub=["b"], nonce="last"),
        DPush(S1),
        DReq(sub=["b"]),
        DPush(S1, ["b"]),
    ],
    "resubscribing to a resource the client has still resends it": [
        DReq(sub=["a"]),
        DPush(S1, ["a"]),
        DReq(nonce="last"),
        DReq(sub=["a"]),
        DPush(S1, ["a"]),
    ],
    "a subscribed cluster that disappears is removed, once": [
        DReq(sub=["a", "b"]),
        DPush(S1, ["a", "b"]),
        DReq(nonce="last"),
        DPush(snap(2, a="a1"), [], ["b"]),
        DReq(nonce="last"),
        DPush(snap(2, a="a1"), unknown=["b"]),  # still subscribed: now merely unknown
    ],
    "NACK: no resend until the resource changes": [
        DReq(sub=["a"]),
        DPush(S1, ["a"]),
        DReq(nonce="last", error="bad", kind=K.NACK),
        DPush(S1),
        DPush(S2, ["a"]),
    ],
    "NACK rolls back, so returning to the ACKed version sends nothing": [
        DReq(sub=["a"]),
        DPush(S1, ["a"]),
        DReq(nonce="last"),
        DPush(S2, ["a"]),
        DReq(nonce="last", error="bad", kind=K.NACK),
        DPush(snap(3, a="a1", b="b1")),
    ],
    "stale nonce: subscription change still honoured": [
        DReq(sub=["a"]),
        DPush(S1, ["a"]),  # nonce 1
        DReq(nonce="last", kind=K.ACK),
        DPush(S2, ["a"]),  # nonce 2
        DReq(nonce="last", kind=K.ACK),
        DReq(sub=["b"], nonce="1", kind=K.STALE),
        DPush(S2, ["b"]),
    ],
    "garbage nonce: stale, subscription honoured": [
        DReq(sub=["a"]),
        DPush(S1, ["a"]),
        DReq(sub=["b"], nonce="zzz", error="?", kind=K.STALE),
        DPush(S1, ["b"]),
    ],
    "unknown cluster ignored and reported once": [
        DReq(sub=["a", "ghost"]),
        DPush(S1, ["a"], unknown=["ghost"]),
        DReq(nonce="last"),
        DPush(S2, ["a"]),
    ],
    "cold cluster held until warm": [
        DReq(sub=["a", "b"]),
        DPush(snap(1, a="a1", b=("b1", False)), ["a"]),
        DReq(nonce="last"),
        DPush(snap(2, a="a1", b="b1"), ["b"]),
    ],
    "legacy wildcard: everything warm, removal when it disappears": [
        DReq(),
        DPush(snap(1, a="a1", b="b1"), ["a", "b"]),
        DReq(nonce="last"),
        DPush(snap(2, a="a1"), [], ["b"]),
    ],
}


@pytest.mark.parametrize("script", DELTA_SCRIPTS.values(), ids=DELTA_SCRIPTS.keys())
def test_delta_script(script: list[DReq | DPush]) -> None:
    run_delta(script)


def test_delta_out_of_order_ack_and_nack_pair_by_nonce() -> None:
    """Two responses in flight: a NACK of the first does not roll back the second."""
    state = run_delta([DReq(sub=["a"]), DPush(S1, ["a"]), DPush(S2, ["a"])])
    outcome = state.on_request(
        subscribe=(), unsubscribe=(), initial_versions={}, response_nonce="1", error="bad"
    )
    assert (outcome.kind, outcome.rejected) == (K.NACK, "a@a1")
    assert state.known == {"a": "a2"}
    ack = state.on_request(
        subscribe=(), unsubscribe=(), initial_versions={}, response_nonce="2", error=None
    )
    assert ack.kind is K.ACK and state.pending == {}


def test_delta_system_version_and_nonce() -> None:
    state = run_delta([DReq(sub=["a", "b"])])
    push = state.plan(S1).push
    assert push is not None
    assert push.nonce == "1"
    assert push.system_version == set_version({"a": "a1", "b": "b1"})


# --------------------------------------------------------------------------- problem tally


def test_a_stream_flooding_other_types_logs_one_line_per_repeat_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The stream's own tally (counts, samples) with core.problems deciding when a kind is
    due: 1,000 requests for other types are one line, then one more a period later."""
    now = [0.0]
    logger = logging.getLogger("test.xds.tally")
    tally = ProblemTally(logger, lambda: "gw-1 ads sotw", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.xds.tally"):
        for n in range(1_000):
            tally.add(KIND_TYPES, 1, (f"type.googleapis.com/t{n % 5}",))
            tally.flush()
            now[0] += 0.01  # 10 s in all: within one period
        now[0] = REPEAT_LOG_S
        tally.flush()  # the period is over: the running count
        tally.add(KIND_TYPES, 1, ("type.googleapis.com/late",))
        tally.flush()  # quiet again
        now[0] = 2 * REPEAT_LOG_S
        tally.flush()
        tally.flush()  # nothing new since the last line
    lines = [r.getMessage() for r in caplog.records if r.name == "test.xds.tally"]
    first = "(first: 'type.googleapis.com/t0', 'type.googleapis.com/t1', 'type.googleapis.com/t2'"
    assert lines == [
        f"gw-1 ads sotw: {KIND_TYPES}: 1 (first: 'type.googleapis.com/t0')",
        f"gw-1 ads sotw: {KIND_TYPES}: 1000 {first}, ...)",
        f"gw-1 ads sotw: {KIND_TYPES}: 1001 {first}, ...)",
    ]
