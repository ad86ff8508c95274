"""Fewer probes where real traffic already proves an endpoint healthy (pure;
docs/design.md §15.4, ``probe.backoff_when_busy``, off by default).

A scheduled probe is skipped when the endpoint's last interval held at least
``min_requests`` successful real requests, one of them in the last half second, no error
and no request that outlived the probe timeout, and fewer than ``every - 1`` probes in a
row were skipped already. Any error, any over-long request, or silence (too few requests,
or none completing right now: a zombie's requests hang, they do not fail) brings the
normal rhythm back at the next slot. A probe is never skipped for an endpoint that is not
HEALTHY.
"""

from __future__ import annotations

from llm_health.traffic.settings import BusyConfig
from llm_health.traffic.window import Recent


def skip(recent: Recent, settings: BusyConfig, skipped_in_a_row: int, healthy: bool) -> bool:
    if not healthy or skipped_in_a_row >= settings.every - 1:
        return False
    proven = recent.successes >= settings.min_requests and recent.latest > 0
    return proven and recent.errors == 0 and recent.long == 0
