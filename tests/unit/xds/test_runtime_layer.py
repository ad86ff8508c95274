"""RTDS stream rules (llm_health.xds.runtime.LayerState): pure, scripted."""

from __future__ import annotations

from llm_health.xds.protocol import RequestKind
from llm_health.xds.runtime import LAYER_NAME, LayerState, layer_version

ON = {"llm_health.shed_low.a": 100.0}
OFF = {"llm_health.shed_low.a": 0.0}


def request(
    state: LayerState,
    names: tuple[str, ...] = (LAYER_NAME,),
    *,
    nonce: str = "",
    version: str = "",
    error: str | None = None,
) -> RequestKind:
    outcome = state.on_request(
        version_info=version, resource_names=names, response_nonce=nonce, error=error
    )
    return outcome.kind


def test_nothing_before_the_first_request_then_the_layer() -> None:
    state = LayerState()
    assert state.plan(OFF).push is None
    assert request(state) is RequestKind.INITIAL
    push = state.plan(OFF).push
    assert push is not None
    assert (push.name, push.layer, push.version, push.nonce) == (
        LAYER_NAME,
        OFF,
        layer_version(OFF),
        "1",
    )
    assert state.plan(OFF).push is None  # in flight: not sent twice


def test_ack_then_a_change_is_pushed_and_a_nack_is_not_resent_until_it_changes() -> None:
    state = LayerState()
    request(state)
    first = state.plan(OFF).push
    assert first is not None
    assert request(state, nonce=first.nonce, version=first.version) is RequestKind.ACK
    assert state.plan(OFF).push is None
    second = state.plan(ON).push
    assert second is not None and second.layer == ON and second.nonce == "2"
    kind = request(state, nonce=second.nonce, version=first.version, error="bad value")
    assert kind is RequestKind.NACK
    assert state.plan(ON).push is None  # refused: not resent
    third = state.plan(OFF).push  # changed back: the client still has OFF, nothing to send
    assert third is None
    fourth = state.plan({"llm_health.shed_low.a": 100.0, "llm_health.shed_low.b": 0.0}).push
    assert fourth is not None and fourth.nonce == "3"


def test_a_stale_nonce_changes_nothing() -> None:
    state = LayerState()
    request(state)
    first = state.plan(OFF).push
    second = state.plan(ON).push
    assert first is not None and second is not None
    assert request(state, (), nonce=first.nonce, version=first.version) is RequestKind.STALE
    assert state.subscription.names == {LAYER_NAME}


def test_unknown_names_are_reported_once_and_get_nothing() -> None:
    state = LayerState()
    request(state, ("other",))
    plan = state.plan(OFF)
    assert plan.push is None and plan.unknown == ("other",)
    assert state.plan(OFF).unknown == ()
    request(state, ("other", LAYER_NAME))
    push = state.plan(OFF).push
    assert push is not None and push.name == LAYER_NAME


def test_no_names_is_the_legacy_wildcard() -> None:
    state = LayerState()
    request(state, ())
    assert state.plan(ON).push is not None


def test_versions_are_content_hashes() -> None:
    assert layer_version(ON) == layer_version(dict(ON))
    assert layer_version(ON) != layer_version(OFF)
    assert layer_version({"a": 1.0, "b": 0.0}) == layer_version({"b": 0.0, "a": 1.0})
