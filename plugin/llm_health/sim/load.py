"""What ``slow_under_load`` does to TTFT under a steady load: the steady-state formula.

Under ``slow_under_load`` a request's TTFT is its drawn TTFT ``t0`` plus
``k = load_ttft_per_request`` times the other inference requests in flight when it
arrives. In flight are requests still in their TTFT wait or still streaming, and a
request of ``n`` tokens streams for ``n × tpot`` after its first token (one ``tpot``
after every token, the last included). With users arriving at ``λ`` per second, each
holding a slot for ``W = T + n × tpot``, Little's law gives ``N = λ·W`` requests in
flight on average, which an arrival sees (exactly for Poisson arrivals, nearly so at a
constant rate), so the mean user TTFT ``T = t0 + k·N`` solves to::

    T = (t0 + k·λ·n·tpot + k·P) / (1 − k·λ)

where ``P`` is the mean number of probes in flight (each ``t0 + m × tpot`` long if the
fault spares probes, ``affects`` "users"; with ``affects`` "all" probes are slowed too
and count in the denominator). There is no steady state once ``k·λ >= 1``: every
arrival waits longer than the last and TTFT grows without bound. Near 1 the result is
very sensitive to the rate. A run from an idle simulator approaches the steady state
geometrically, the gap shrinking by a factor ``k·λ`` every ``W`` or so.
"""

from __future__ import annotations

import math

from llm_health.sim.faults import FaultSpec

__all__ = ["slow_under_load_ttft"]


def slow_under_load_ttft(
    spec: FaultSpec,
    user_rate: float,
    user_tokens: int,
    probe_rate: float = 0.0,
    probe_tokens: int = 1,
) -> float:
    """The steady-state mean TTFT, in seconds, of user requests under ``slow_under_load``.

    ``spec`` gives ``ttft`` (its mean: jitter is taken as symmetric), ``tpot``,
    ``load_ttft_per_request`` and ``affects``. Users arrive at ``user_rate`` per second
    and stream ``user_tokens`` tokens; probes (``X-LLM-Probe: true``) at ``probe_rate``
    with ``probe_tokens`` tokens. Raises ValueError for a negative rate, fewer than one
    token, or a load with no steady state (``load_ttft_per_request × arrival rate of
    slowed requests >= 1``).
    """
    if not (math.isfinite(user_rate) and math.isfinite(probe_rate)):
        raise ValueError("rates must be finite")
    if user_rate < 0 or probe_rate < 0:
        raise ValueError(f"rates must not be negative, got {user_rate!r}, {probe_rate!r}")
    if user_tokens < 1 or probe_tokens < 1:
        raise ValueError(f"tokens must be at least 1, got {user_tokens!r}, {probe_tokens!r}")
    t0, k = spec.ttft, spec.load_ttft_per_request
    user_stream = user_tokens * spec.tpot
    probe_stream = probe_tokens * spec.tpot
    if spec.affects == "users":  # probes: base TTFT, never slowed
        slowed_rate = user_rate
        numerator = t0 + k * (user_rate * user_stream + probe_rate * (t0 + probe_stream))
    else:  # probes are slowed like users and hold their slot as long
        slowed_rate = user_rate + probe_rate
        numerator = t0 + k * (user_rate * user_stream + probe_rate * probe_stream)
    load = k * slowed_rate
    if load >= 1:
        raise ValueError(
            f"no steady state: load_ttft_per_request × rate = {load:.3g} >= 1 "
            "(each arrival waits longer than the last)"
        )
    return numerator / (1 - load)
