"""What replicas write to Redis and read back: verdicts, membership, operator actions.

Everything read here was written by another process, possibly a broken or hostile one:
``decode_*`` check types, enums, sizes and finiteness and raise ``WireError`` (one line,
bounded, printable) instead of passing anything on. Pure: no I/O, no clock.

Stored verdict (hash ``<prefix>:verdicts``, field = endpoint key):
    "<seq>|<published_ms>|<json>"
``seq`` and ``published_ms`` are set by the publish script from the Redis server's clock
(``scripts.PUBLISH``); the JSON is the owner's ``Verdict`` body. A message on the events
channel is "v\\n<key>\\n<stored verdict>", "a\\n<action json>" or "m\\n<member>" (membership
changed: refresh now).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from llm_health.model.causes import Cause
from llm_health.model.outcome import Outcome
from llm_health.model.redact import printable_line
from llm_health.model.states import State

MAX_STORED = 4096  # bytes of one stored verdict or action
MAX_REASON = 500
MAX_NAME = 300
MAX_MEMBERS = 1000
MAX_COUNT = 1_000_000


class WireError(ValueError):
    """Something in Redis we cannot use; the message is safe to log."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One endpoint's health as its owner last published it. ``since`` is wall seconds;
    the counters let a new owner continue the state machine where the old one was."""

    cluster: str
    address: str
    state: State
    reason: str
    cause: Cause
    since: float
    outcome: Outcome | None
    ttft_ms: float | None
    successes: int
    fast_streak: int
    failures: int
    owner: str
    epoch: int
    seq: int = 0  # set by Redis (publish script)
    published_ms: int = 0  # Redis server time, ms


@dataclass(frozen=True, slots=True)
class Member:
    epoch: int
    beat_ms: int  # Redis server time of its last heartbeat that vouched for its verdicts


@dataclass(frozen=True, slots=True)
class Membership:
    """The live members as the heartbeat script saw them, at Redis time ``now_ms``."""

    now_ms: int
    members: dict[str, Member]


@dataclass(frozen=True, slots=True)
class Action:
    """An operator action taken through one replica's admin API, for every replica.
    ``until`` (wall seconds) for "force" only; ``state`` for "force" only."""

    kind: str  # drain | undrain | force | clear
    cluster: str
    address: str
    reason: str
    sender: str
    state: State | None = None
    until: float | None = None


ACTION_KINDS = frozenset({"drain", "undrain", "force", "clear"})


# --- verdicts -----------------------------------------------------------------------------


def verdict_body(verdict: Verdict) -> str:
    """The JSON the owner hands the publish script (seq and time come from Redis)."""
    return json.dumps(
        {
            "c": verdict.cluster,
            "a": verdict.address,
            "s": verdict.state.value,
            "r": verdict.reason,
            "k": verdict.cause.value,
            "t": verdict.since,
            "o": None if verdict.outcome is None else verdict.outcome.value,
            "f": verdict.ttft_ms,
            "n": [verdict.successes, verdict.fast_streak, verdict.failures],
            "w": verdict.owner,
            "e": verdict.epoch,
        },
        separators=(",", ":"),
    )


def decode_stored(key: str, stored: bytes | str) -> Verdict:
    """A stored verdict (or the verdict of a "v" event) for endpoint ``key``."""
    text = _text(stored)
    seq_text, _, rest = text.partition("|")
    published_text, _, body = rest.partition("|")
    seq, published = _int(seq_text, "seq"), _int(published_text, "published")
    data = _object(body)
    verdict = Verdict(
        cluster=_name(data.get("c"), "cluster"),
        address=_name(data.get("a"), "address"),
        state=_enum(State, data.get("s"), "state"),
        reason=_reason(data.get("r")),
        cause=_enum(Cause, data.get("k"), "cause"),
        since=_finite(data.get("t"), "since"),
        outcome=None if data.get("o") is None else _enum(Outcome, data.get("o"), "outcome"),
        ttft_ms=None if data.get("f") is None else _finite(data.get("f"), "ttft_ms"),
        successes=_count(_item(data.get("n"), 0), "successes"),
        fast_streak=_count(_item(data.get("n"), 1), "fast_streak"),
        failures=_count(_item(data.get("n"), 2), "failures"),
        owner=_name(data.get("w"), "owner"),
        epoch=_int(data.get("e"), "epoch"),
        seq=seq,
        published_ms=published,
    )
    if f"{verdict.cluster}|{verdict.address}" != key:
        raise WireError("verdict stored under another endpoint's key")
    return verdict


def rejection(
    verdict: Verdict, *, me: str, owner: str | None, owner_epoch: int | None, last_seq: int
) -> str | None:
    """Why a replica must not apply ``verdict`` of an endpoint whose owner it computes as
    ``owner`` (with that member's current ``owner_epoch``), having applied up to
    ``last_seq``; None: apply it. Fencing (docs/design.md §12.4): only the current owner's
    current incarnation, only newer than what was applied."""
    if verdict.owner == me:
        return "our own"
    if verdict.owner != owner:
        return "not from the endpoint's owner"
    if verdict.epoch != owner_epoch:
        return "from a former incarnation of the owner"
    if verdict.seq <= last_seq:
        return "not newer than the verdict applied"
    return None


# --- membership -----------------------------------------------------------------------------


def decode_membership(reply: Any) -> Membership | None:
    """The heartbeat script's reply: ["ok", now_ms, id1, epoch1, beat1, id2, ...] or
    ["gone"] (None: this member was evicted and must join again)."""
    items = [_text(item) for item in _list(reply)]
    if items and items[0] == "gone":
        return None
    if len(items) < 2 or items[0] != "ok" or (len(items) - 2) % 3:
        raise WireError("malformed heartbeat reply")
    if (len(items) - 2) // 3 > MAX_MEMBERS:
        raise WireError(f"more than {MAX_MEMBERS} members")
    members: dict[str, Member] = {}
    for index in range(2, len(items), 3):
        member = _name(items[index], "member")
        members[member] = Member(_int(items[index + 1], "epoch"), _int(items[index + 2], "beat"))
    return Membership(_int(items[1], "now"), members)


# --- actions --------------------------------------------------------------------------------


def action_body(action: Action) -> str:
    return json.dumps(
        {
            "k": action.kind,
            "c": action.cluster,
            "a": action.address,
            "r": action.reason,
            "w": action.sender,
            "s": None if action.state is None else action.state.value,
            "u": action.until,
        },
        separators=(",", ":"),
    )


def decode_action(stored: bytes | str) -> Action:
    data = _object(_text(stored))
    kind = data.get("k")
    if kind not in ACTION_KINDS:
        raise WireError("unknown action kind")
    state = None if data.get("s") is None else _enum(State, data.get("s"), "state")
    until = None if data.get("u") is None else _finite(data.get("u"), "until")
    if kind == "force" and (state is None or until is None):
        raise WireError("a force action needs a state and an end")
    return Action(
        kind=str(kind),
        cluster=_name(data.get("c"), "cluster"),
        address=_name(data.get("a"), "address"),
        reason=_reason(data.get("r")),
        sender=_name(data.get("w"), "sender"),
        state=state,
        until=until,
    )


# --- checks ---------------------------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        if len(value) > MAX_STORED:
            raise WireError(f"over {MAX_STORED} bytes")
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise WireError("not UTF-8") from None
    if isinstance(value, str):
        if len(value) > MAX_STORED:
            raise WireError(f"over {MAX_STORED} characters")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise WireError(f"unexpected {type(value).__name__}")


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise WireError("not a list")
    return value


def _object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        raise WireError("not JSON") from None
    if not isinstance(data, dict):
        raise WireError("not a JSON object")
    return data


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME or not value.isprintable():
        raise WireError(f"bad {what}")
    return value


def _reason(value: Any) -> str:
    if not isinstance(value, str):
        raise WireError("bad reason")
    return printable_line(value, MAX_REASON)


def _enum(kind: Any, value: Any, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise WireError(f"bad {what}") from None


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WireError(f"bad {what}")
    return float(value)


def _int(value: Any, what: str) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    raise WireError(f"bad {what}")


def _count(value: Any, what: str) -> int:
    number = _int(value, what)
    if number > MAX_COUNT:
        raise WireError(f"bad {what}")
    return number


def _item(value: Any, index: int) -> Any:
    if not isinstance(value, list) or len(value) != 3:
        raise WireError("bad counters")
    return value[index]
