"""Fleet mode, the pure parts (docs/design.md §12): rendezvous ownership, the wire format
of what replicas write to Redis (decoded as untrusted), the fencing rule, the config."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from llm_health.config import parse_config
from llm_health.errors import ConfigError
from llm_health.fleet.ownership import endpoint_key, owner_of, split_key
from llm_health.fleet.wire import (
    Action,
    Verdict,
    WireError,
    action_body,
    decode_action,
    decode_membership,
    decode_stored,
    rejection,
    verdict_body,
)
from llm_health.model.causes import Cause
from llm_health.model.outcome import Outcome
from llm_health.model.states import State

KEYS = [endpoint_key("c", f"10.0.{i // 250}.{i % 250}:8000") for i in range(2000)]


# --- ownership ---------------------------------------------------------------------------


def test_owner_is_the_same_whatever_the_member_order() -> None:
    members = ["gw-a", "gw-b", "gw-c"]
    for key in KEYS[:200]:
        assert owner_of(key, members) == owner_of(key, list(reversed(members)))
    assert owner_of(KEYS[0], []) is None


def test_a_join_moves_only_its_share() -> None:
    before = {k: owner_of(k, ["a", "b", "c"]) for k in KEYS}
    after = {k: owner_of(k, ["a", "b", "c", "d"]) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "d" for k in moved)  # only to the newcomer
    assert 0.18 <= len(moved) / len(KEYS) <= 0.32  # about 1/4
    shares = {m: sum(1 for o in after.values() if o == m) / len(KEYS) for m in "abcd"}
    assert all(0.18 <= s <= 0.32 for s in shares.values()), shares


def test_a_leave_moves_only_what_it_held() -> None:
    before = {k: owner_of(k, ["a", "b", "c"]) for k in KEYS}
    after = {k: owner_of(k, ["a", "c"]) for k in KEYS}
    assert all(before[k] == "b" for k in KEYS if before[k] != after[k])


def test_endpoint_keys_round_trip() -> None:
    assert split_key(endpoint_key("llama-70b", "[::1]:8000")) == ("llama-70b", "[::1]:8000")
    with pytest.raises(ValueError):
        split_key("no-separator")


# --- verdicts on the wire ----------------------------------------------------------------

VERDICT = Verdict(
    cluster="c",
    address="10.0.0.1:8000",
    state=State.DEGRADED,
    reason="slow: TTFT 412 ms > 200 ms",
    cause=Cause.SLOW,
    since=1_796_000_000.5,
    outcome=Outcome.SLOW,
    ttft_ms=412.3,
    successes=2,
    fast_streak=0,
    failures=0,
    owner="gw-1",
    epoch=1_796_000_000_123_456,
)
KEY = endpoint_key("c", "10.0.0.1:8000")


def stored(body: str, seq: int = 7, published: int = 1_796_000_001_000) -> str:
    return f"{seq}|{published}|{body}"


def test_verdict_round_trip() -> None:
    decoded = decode_stored(KEY, stored(verdict_body(VERDICT)).encode())
    assert decoded == replace(VERDICT, seq=7, published_ms=1_796_000_001_000)


def body_with(**changes: Any) -> str:
    import json

    data = json.loads(verdict_body(VERDICT))
    data.update(changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"x" * 5000, "over 4096 bytes"),
        ("7|1|not json", "not JSON"),
        ("7|1|[1,2]", "not a JSON object"),
        ("x|1|{}", "bad seq"),
        ("7|-1|{}", "bad published"),
        ("7|1|" + body_with(s="zombie"), "bad state"),
        ("7|1|" + body_with(k="because"), "bad cause"),
        ("7|1|" + body_with(t=float("nan")), "bad since"),
        ("7|1|" + body_with(t="yesterday"), "bad since"),
        ("7|1|" + body_with(f=float("inf")), "bad ttft_ms"),
        ("7|1|" + body_with(n=[1, 2]), "bad counters"),
        ("7|1|" + body_with(n=[10**9, 0, 0]), "bad successes"),
        ("7|1|" + body_with(n=[True, 0, 0]), "bad successes"),
        ("7|1|" + body_with(w=""), "bad owner"),
        ("7|1|" + body_with(w="gw\x1b[2J"), "bad owner"),
        ("7|1|" + body_with(e=-5), "bad epoch"),
        ("7|1|" + body_with(e=2**64), "bad epoch"),
        ("7|1|" + body_with(a="10.0.0.2:8000"), "another endpoint's key"),
        ("7|1|" + body_with(c=["c"]), "bad cluster"),
    ],
)
def test_hostile_stored_verdicts_are_refused(text: str | bytes, problem: str) -> None:
    with pytest.raises(WireError) as info:
        decode_stored(KEY, text)
    assert problem in str(info.value)
    assert str(info.value).isprintable() and len(str(info.value)) < 100


def test_reason_from_redis_is_made_printable_and_bounded() -> None:
    decoded = decode_stored(KEY, stored(body_with(r="\x1b[31mred\n" + "x" * 2000)))
    assert decoded.reason.isprintable() and len(decoded.reason) <= 500


@pytest.mark.parametrize(
    ("changes", "owner", "owner_epoch", "last_seq", "why"),
    [
        ({}, "gw-1", VERDICT.epoch, 6, None),
        ({}, "gw-1", VERDICT.epoch, 7, "not newer than the verdict applied"),
        ({}, "gw-2", 5, 0, "not from the endpoint's owner"),
        ({}, "gw-1", VERDICT.epoch + 1, 0, "from a former incarnation of the owner"),
        ({}, "gw-1", None, 0, "from a former incarnation of the owner"),
        ({"owner": "me"}, "me", 1, 0, "our own"),
    ],
    ids=["apply", "old", "not-owner", "paused-and-rejoined", "owner-gone", "own"],
)
def test_fencing_rule(
    changes: dict[str, Any], owner: str, owner_epoch: int | None, last_seq: int, why: str | None
) -> None:
    verdict = replace(VERDICT, seq=7, **changes)
    assert (
        rejection(verdict, me="me", owner=owner, owner_epoch=owner_epoch, last_seq=last_seq) == why
    )


# --- membership and actions ----------------------------------------------------------------


def test_membership_reply() -> None:
    reply = [b"ok", b"1000", b"gw-0", b"11", b"990", b"gw-1", b"12", b"1000"]
    membership = decode_membership(reply)
    assert membership is not None and membership.now_ms == 1000
    assert {m: (v.epoch, v.beat_ms) for m, v in membership.members.items()} == {
        "gw-0": (11, 990),
        "gw-1": (12, 1000),
    }
    assert decode_membership([b"gone"]) is None


@pytest.mark.parametrize(
    "reply",
    [b"ok", [b"ok"], [b"ok", b"1", b"gw"], [b"ok", b"1", b"gw", b"x", b"1"], [b"what", b"1"]],
)
def test_malformed_membership_is_refused(reply: Any) -> None:
    with pytest.raises(WireError):
        decode_membership(reply)


def test_action_round_trip_and_refusals() -> None:
    action = Action("force", "c", "10.0.0.1:8000", "maintenance", "gw-0", State.UNHEALTHY, 1e9)
    assert decode_action(action_body(action)) == action
    with pytest.raises(WireError, match="unknown action kind"):
        decode_action('{"k": "format-disk", "c": "c", "a": "x", "r": "", "w": "gw"}')
    with pytest.raises(WireError, match="needs a state and an end"):
        decode_action(action_body(replace(action, until=None)))


# --- config ----------------------------------------------------------------------------------


def fleet_config(fleet: str) -> Any:
    return parse_config(
        f"fleet: {fleet}\nclusters: [{{name: c, endpoints: [{{address: '127.0.0.1:1'}}]}}]\n",
        "x.yaml",
        {"REDIS_PASSWORD": "s3cr3t-redis-pw"},
    )


def test_fleet_settings() -> None:
    config = fleet_config(
        "{redis: 'redis://:${REDIS_PASSWORD}@10.0.0.5:6379/0', name: prod-gateway, "
        "member_id: gw-0, heartbeat: 500ms, member_ttl: 2s}"
    )
    fleet = config.fleet
    assert fleet is not None
    assert fleet.where == "redis://10.0.0.5:6379/0"  # never the password
    assert (fleet.member("host-1"), fleet.heartbeat, fleet.member_ttl) == ("gw-0", 0.5, 2.0)
    assert fleet.fresh == 4.0
    assert "s3cr3t-redis-pw" in config.secret_values()  # scrubbed from logs and /status
    default = fleet_config("{redis: 'redis://127.0.0.1:6379', name: gw}").fleet
    assert default is not None and default.member("host-1") == "host-1"


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        ("{redis: 'http://127.0.0.1', name: gw}", "must be a redis://, rediss:// or unix:// URL"),
        ("{redis: 'redis://10.0.0.5:6379', name: gw}", "is not on loopback: put credentials"),
        ("{redis: 'redis://127.0.0.1:70000', name: gw}", "port"),
        ("{redis: 'unix://relative.sock', name: gw}", "absolute socket path"),
        ("{redis: 'redis://127.0.0.1', name: 'a b'}", "must be 1-128 of"),
        ("{redis: 'redis://127.0.0.1', name: gw, member_id: '-x'}", "must be 1-128 of"),
        ("{redis: 'redis://127.0.0.1', name: gw, heartbeat: 2s, member_ttl: 3s}", "at least twice"),
        ("{redis: 'redis://127.0.0.1', name: gw, member_ttl: 1s}", "at least twice"),
        ("{redis: 'redis://127.0.0.1'}", "name: required"),
        ("{redis: 'redis://127.0.0.1', name: gw, members: 3}", "members"),
    ],
)
def test_bad_fleet_config_is_named(fleet: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        fleet_config(fleet)
    (message,) = info.value.messages
    assert message.startswith("x.yaml:1 fleet") and expected in message, message
    assert "s3cr3t" not in message
