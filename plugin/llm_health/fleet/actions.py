"""Operator actions shared by the fleet (docs/design.md §12.8): an action taken through
this replica's admin API, as every replica receives it (``shared``), and a received one
as the change of this replica's board (``mutation``). Pure: no I/O, no clock.
"""

from __future__ import annotations

from llm_health.core.control import Mutation, OperatorAction
from llm_health.fleet.wire import Action
from llm_health.model.board import Board
from llm_health.model.machine import Transition


def shared(action: OperatorAction, sender: str) -> Action:
    """``action``, applied here, for every replica of the fleet."""
    return Action(
        action.kind,
        action.cluster,
        action.address,
        action.reason,
        sender,
        action.state,
        action.until,
    )


def still_forced(action: Action, wall_now: float) -> bool:
    """A stored override still running (applied by a replica that starts meanwhile)."""
    return action.until is not None and action.until > wall_now


def mutation(action: Action, wall_now: float) -> Mutation[Transition | None]:
    """What ``action`` does to a board (the endpoint must be on it); the mutation returns
    the state machine's transition (drain, undrain), None for an override (force, clear:
    they change what readers see, not the machine). A force keeps its remaining time
    (``until`` is wall seconds, the board's clock is monotonic)."""
    cluster, address = action.cluster, action.address
    if action.kind == "drain":
        return lambda board, now: board.drain(cluster, address, now, action.reason)
    if action.kind == "undrain":
        return lambda board, now: board.undrain(cluster, address, now)
    if action.kind == "force" and action.state is not None and action.until is not None:
        state, left = action.state, action.until - wall_now

        def force(board: Board, now: float) -> None:
            board.set_override(cluster, address, state, now + left, action.reason)

        return force

    def clear(board: Board, _now: float) -> None:
        board.clear_override(cluster, address)

    return clear
