"""What the engine checks set on the board (pure; docs/design.md §14): the "verify" and
"model" signals (UNHEALTHY while held) and the "engine" limit (at most DEGRADED), as
mutations for ``BoardControl.update``. Each touches only the endpoints it names: one
whole-cluster view per known-answer probe was O(endpoints) each (docs/design.md §16.1).
"""

from __future__ import annotations

from collections.abc import Callable

from llm_health.core.control import Mutation
from llm_health.engines.verify import Judgement, Verdict
from llm_health.model.admission import Admission
from llm_health.model.board import Board
from llm_health.model.causes import Cause
from llm_health.model.machine import Transition

VERIFY_SIGNAL = "verify"
MODEL_SIGNAL = "model"
ENGINE_LIMIT = "engine"
ALL_SOURCES = frozenset({VERIFY_SIGNAL, MODEL_SIGNAL, ENGINE_LIMIT})
Changes = dict[str, tuple[str | None, Cause]]  # address -> (reason; None: clear, cause)
Endpoint = tuple[str, str]  # (cluster, address)


def verify_change(judgement: Judgement) -> tuple[str | None, Cause] | None:
    """What a judgement does to its endpoint's "verify" signal: hold it (reason, cause),
    lift it (None), or nothing."""
    if judgement.down:
        cause = Cause.GARBAGE if judgement.verdict is Verdict.GARBAGE else Cause.WRONG_ANSWER
        return judgement.reason, cause
    if judgement.verdict is Verdict.PASS:
        return None, Cause.WRONG_ANSWER
    if judgement.verdict is Verdict.SOUND:
        return None, Cause.GARBAGE
    return None


def set_signals(cluster: str, source: str, changes: Changes) -> Mutation[dict[str, Transition]]:
    """Set or clear ``source``'s signal on the endpoints in ``changes``, only where it
    differs from the board's; the transitions made, by address."""

    def apply(board: Board, now: float) -> dict[str, Transition]:
        done: dict[str, Transition] = {}
        for address, (reason, cause) in changes.items():
            if not board.has_endpoint(cluster, address):
                continue
            if board.signal(cluster, address, source) == reason:
                continue
            done[address] = board.set_signal(cluster, address, source, reason, now, cause)
        return done

    return apply


def set_engine_limit(cluster: str, address: str, reason: str | None) -> Mutation[Transition | None]:
    """Set (saturated: ``reason``) or lift (None) the endpoint's "engine" limit."""

    def apply(board: Board, now: float) -> Transition | None:
        if not board.has_endpoint(cluster, address):
            return None
        return board.set_limit(cluster, address, ENGINE_LIMIT, reason, now, Cause.SATURATED)

    return apply


def note_admission(
    cluster: str, address: str, update: Callable[[Admission, float], Admission]
) -> Mutation[None]:
    """Fold a /metrics read into the endpoint's admission evidence (``model.admission``):
    ``update(admission, now)`` on the board's clock. Nothing Envoy sees changes."""

    def apply(board: Board, now: float) -> None:
        if board.has_endpoint(cluster, address):
            board.note_admission(cluster, address, lambda admission: update(admission, now))

    return apply


def release(stale: dict[Endpoint, frozenset[str]]) -> Mutation[int]:
    """Lift what the checks hold on endpoints they no longer check (per endpoint, the
    sources released); how many were lifted."""

    def apply(board: Board, now: float) -> int:
        released = 0
        held = {
            (c.name, e.spec.address): (set(e.signals), set(e.limits))
            for c in board.snapshot().clusters.values()
            for e in c.endpoints
            if e.signals or e.limits
        }
        for key, sources in stale.items():
            signals, limits = held.get(key, (set(), set()))
            for source in sorted(sources & signals & {VERIFY_SIGNAL, MODEL_SIGNAL}):
                board.set_signal(*key, source, None, now)
                released += 1
            if ENGINE_LIMIT in sources and ENGINE_LIMIT in limits:
                board.set_limit(*key, ENGINE_LIMIT, None, now)
                released += 1
        return released

    return apply
