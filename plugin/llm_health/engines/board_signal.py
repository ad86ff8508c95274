"""Setting a board signal from an engine check, and reporting what it changed (the
known-answer and served-model checks both do)."""

from __future__ import annotations

from llm_health.core.control import BoardControl
from llm_health.engines.verdicts import Changes, set_signals


def set_signal(control: BoardControl, cluster: str, source: str, changes: Changes) -> None:
    """Set or clear ``source``'s signal on the endpoints in ``changes``, one publish for
    the batch; the state changes it makes are reported."""
    applied = control.update_now(set_signals(cluster, source, changes), publish_when=bool)
    for address, transition in applied.items():
        if transition.changed or transition.alert:
            control.notify(cluster, address, transition, None)
