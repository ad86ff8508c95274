"""Admission progress: is a slow or timed-out probe a verdict about load, or about health?
(pure, no I/O, the clock passed in; docs/design.md §3.5, the overload rule).

A probe that waits behind a queue of real requests times out on a saturated engine as on
a hung one. What tells them apart is whether the engine still *admits* new requests
while the probe waits: prefills them (its prompt-token counter grows: ``engines.metrics``,
docs/engines.md) or gives real users their first token (the access-log stream:
``traffic``). While it does, a SLOW or TIMEOUT probe is OVERLOADED (``excused``): the
endpoint is DEGRADED at most, never UNHEALTHY, and the kubelet keeps it Ready
(docs/agent.md). Without that evidence the rule of docs/design.md §3 stands.

The evidence is the admission *during the wait*: two reads of the counter taken after the
probe was sent (``ProbeResult.admission``, from ``engines.bracket``). Admission before the
wait proves nothing: users admitted, then a hang, is the zombie this service exists to
catch, and it must be out within the idle bound. ``admission_window`` (``window_s``, off
by default) lets what the scheduled reads saw up to that long before the wait count too,
for engines that admit seldom even when they serve (long generations, small batches), at
the price of a hang right after an admission being judged that much later.

What is not evidence, on purpose:
- gauges (requests waiting or running, KV cache): a frozen engine core leaves them at
  their busy values, and vLLM's /metrics, served by its API process, keeps answering;
- decode or completion counters: in a scheduler deadlock (KV blocks leaked, no slot for a
  new request) running requests keep decoding and finishing while new ones never start;
- a failed /metrics read: it changes nothing (there is no ``after_read`` for it);
- a scheduled read's advance whose span (since the read before) began before the window:
  a read does not say when in its span the counter grew;
- an advance our own probes may explain: one of them got its first token while the
  counter moved (it was admitted then);
- any advance while the engine's last good read showed fewer than ``BUSY`` requests in
  it (running and waiting): nothing queues there, so a probe that waits is not waiting
  behind load. Gauges only ever withhold evidence here, never give it.
"""

from __future__ import annotations

from dataclasses import replace

from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.value import value

EXCUSABLE = frozenset({Outcome.SLOW, Outcome.TIMEOUT})
# Requests in the engine (running plus waiting) at the last read for a wait to be load:
# more than the one probe that waits.
BUSY = 2.0


@value
class Admission:
    """What one endpoint's engine showed of admitting new requests, on the board's
    (monotonic) clock. ``counter``: the admission counter's name (reasons quote it);
    ``count``: its value at the last good read (None: no baseline: never read, or not
    exported; a failed read changes nothing, what good reads saw ages out of the window);
    ``advanced_at``: the read that last saw it grow,
    by ``advanced_by`` over ``advanced_over_s`` seconds since the read before;
    ``first_token_at``: when a real request last got its first token (access logs);
    ``in_flight``: requests running and waiting at the last good read (None: the engine
    does not export them; below ``BUSY``: no evidence counts).
    ``window_s``: how far before a probe's wait evidence still counts
    (``probe.engine_metrics.admission_window``; 0, the default: only during the wait;
    docs/design.md §3.5)."""

    counter: str = ""
    count: float | None = None
    read_at: float | None = None
    advanced_at: float | None = None
    advanced_by: float = 0.0
    advanced_over_s: float = 0.0
    first_token_at: float | None = None
    in_flight: float | None = None
    window_s: float = 0.0
    probe_from: float | None = None  # the last probe that got a first token: its span
    probe_to: float | None = None


NO_ADMISSION = Admission()


def after_read(
    admission: Admission,
    counter: str,
    count: float | None,
    now: float,
    window_s: float,
    in_flight: float | None = None,
) -> Admission:
    """A good /metrics read (``in_flight``: its requests running and waiting). The first
    value (or a counter that went back: a new process) is a baseline, not progress; a larger value than the last is an
    advance seen ``now``, unless one of our own probes may have made it
    (``after_probe_token``)."""
    before, read_before = admission.count, admission.read_at
    fresh = replace(
        admission,
        counter=counter,
        count=count,
        read_at=now,
        window_s=window_s,
        in_flight=in_flight,
    )
    if (
        count is None
        or before is None
        or read_before is None
        or count <= before
        or counter != admission.counter
    ):
        return fresh
    if _ours(admission, read_before, now):
        return fresh
    return replace(
        fresh, advanced_at=now, advanced_by=count - before, advanced_over_s=now - read_before
    )


def after_probe_token(admission: Admission, started: float, now: float) -> Admission:
    """One of our probes, started at ``started``, got its first token by ``now``: it was
    admitted in between, so an advance seen over that span may be its own (no evidence).
    """
    advanced = admission.advanced_at
    if advanced is not None and _overlap(
        advanced - admission.advanced_over_s, advanced, started, now
    ):
        return replace(admission, advanced_at=None, probe_from=started, probe_to=now)
    return replace(admission, probe_from=started, probe_to=now)


def _ours(admission: Admission, since: float, until: float) -> bool:
    """Our last probe with a first token was admitted within (since, until], perhaps."""
    start, end = admission.probe_from, admission.probe_to
    return start is not None and end is not None and _overlap(since, until, start, end)


def _overlap(a_from: float, a_to: float, b_from: float, b_to: float) -> bool:
    return a_from <= b_to and b_from <= a_to


def after_first_token(admission: Admission, at: float) -> Admission:
    """A real request got its first token ``at`` (board clock)."""
    if admission.first_token_at is not None and admission.first_token_at >= at:
        return admission
    return replace(admission, first_token_at=at)


def evidence(result: ProbeResult, admission: Admission, now: float) -> str | None:
    """Why ``result`` (SLOW or TIMEOUT, folded at ``now``) is a verdict about load: the
    admission seen during its wait (``result.admission``: reads taken after it was sent,
    ``engines.bracket``), else a real request's first token in its wait; with a window
    (``window_s`` > 0), also an advance or a first token up to ``window_s`` before it. None:
    no such evidence (then it is judged as it is)."""
    if result.outcome not in EXCUSABLE or idle(admission):
        return None
    if result.admission:
        return result.admission
    since = now - result.total_ms / 1000 - admission.window_s
    advanced = admission.advanced_at
    # The whole span the advance happened in lies after ``since``: a read that finds an
    # advance does not say when in its span it came, and one that began before the wait
    # may show users admitted just before a hang.
    if advanced is not None and since <= advanced - admission.advanced_over_s and advanced <= now:
        return (
            f"{admission.counter} +{admission.advanced_by:g} in "
            f"{admission.advanced_over_s:.1f} s, {now - advanced:.1f} s ago"
        )
    token = admission.first_token_at
    if token is not None and since <= token <= now:
        return f"a real request's first token {now - token:.1f} s ago"
    return None


def idle(admission: Admission) -> bool:
    """The last good read showed fewer than ``BUSY`` requests in the engine: whatever it
    admitted before, nothing queues there now."""
    return admission.in_flight is not None and admission.in_flight < BUSY


def excused(result: ProbeResult, admission: Admission, now: float) -> ProbeResult:
    """``result`` as the machine judges it: a SLOW or TIMEOUT probe with admission
    evidence (``evidence``) becomes OVERLOADED, its detail naming the evidence (the state's
    reason then reads e.g. "overloaded: timed out behind a queue: vllm:prompt_tokens_total
    +512 during the wait"), marked ``excused`` (the machine counts it as a success
    that is not fast: ``machine._count``); its timings are kept. Any other result is
    returned as it is."""
    why = evidence(result, admission, now)
    if why is None:
        return result
    if result.outcome is Outcome.TIMEOUT:
        wait = "timed out behind a queue"
    else:
        wait = f"slow behind a queue (first token {result.ttft_ms or 0:.0f} ms)"
    return replace(result, outcome=Outcome.OVERLOADED, detail=f"{wait}: {why}", excused=True)
