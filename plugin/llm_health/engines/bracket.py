"""Reads that bracket a probe's wait (docs/design.md §3.5, the overload rule): was the
engine admitting new requests while this probe waited?

A probe that has no first token a quarter of its timeout in (BASELINE_AT) gets a /metrics
read of its endpoint then (the baseline); if it times out, one more read, taken then (the
confirming read), before the timeout is told. The admission counter grew between the two
(``EngineLoad.admitted``): the engine admitted requests *during* this wait, and the
timeout is told with that evidence (``ProbeResult.admission``). Both reads are sent after
the probe was, so an admission just before the wait (users admitted, then a hang) never
counts: that is what periodic reads cannot tell (a read that finds an advance does not
say whether it came before the probe was sent or after).

Every bracketed timeout is counted by what its reads showed (``Evidence``): an operator
whose engine left under load can tell "no admission" (the rule judged it) from "a read
was late" (the reads could not tell in time).

Fast probes cost no read. Bounded: a timeout waits CONFIRM_WITHIN_S for its reads (an
engine whose /metrics hangs too is judged on what is known), or twice the time the
baseline read took when that is longer, up to the probe's own timeout: a /metrics that
answers slowly but answers (the API process of a busy engine, starved) is waited for; no read
is started while the side reads are at their cap (``read_queue.MAX_PENDING_READS``), and
then the timeout is told at once, with no evidence.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import replace

from llm_health.engines.metrics import admission_counter
from llm_health.model.engine_load import EngineLoad
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.signals import ProbeReceiver, Started, Starter
from llm_health.probe.target import ProbeTarget

BASELINE_AT = 0.25  # of the probe's timeout: a probe without a token by then gets a read
CONFIRM_WITHIN_S = 0.5  # the least a timeout waits for its reads (``confirm_wait``)


class Evidence(enum.Enum):
    """What the reads around one timeout showed (the label of its count)."""

    ADMISSION = "admission"  # the counter grew during the wait: told with it
    NONE = "none"  # both reads over, no growth: a timeout like any other
    NO_BASELINE = "no_baseline"  # the read a quarter in could not start, or failed
    NO_CONFIRM = "no_confirm"  # the read at the timeout could not start, or failed
    LATE = "late"  # a read still under way ``confirm_wait`` after the timeout


Then = Callable[[EngineLoad | None], None]
# Start a /metrics read of the target now, ``then`` told its load (None: it failed);
# False: none could be started.
ReadNow = Callable[[ProbeTarget, Then], bool]
Count = Callable[[Evidence], None]


def bracketing(
    start: Starter,
    read_now: ReadNow,
    reads_metrics: Callable[[ProbeTarget], bool],
    count: Count,
) -> Starter:
    """``start`` with the waits of its slow probes bracketed by two reads:
    ``read_now(target, then)``; ``reads_metrics(target)``: the endpoint's /metrics is read
    (else the probe is started as it is); ``count``: told what each bracketed timeout's
    reads showed."""

    def start_bracketed(target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        if not reads_metrics(target):
            return start(target, receiver)
        bracket = _Bracket(target, receiver, read_now, count)
        bracket.probe = start(target, bracket)
        bracket.arm()
        return bracket

    return start_bracketed


def confirm_wait(baseline_took_s: float | None, timeout_s: float) -> float:
    """How long a timeout waits for its reads: CONFIRM_WITHIN_S, or twice the time the
    baseline read took (the confirming read is the same read, later), up to the probe's
    timeout; no longer than CONFIRM_WITHIN_S while the baseline is not over (its /metrics
    may hang with the rest)."""
    if baseline_took_s is None:
        return CONFIRM_WITHIN_S
    return max(CONFIRM_WITHIN_S, min(2 * baseline_took_s, timeout_s))


def admitted_between(before: EngineLoad | None, after: EngineLoad | None) -> str:
    """The admission the two reads show (their counter grew in the same process), as a
    reason names it; "" when they show none."""
    if before is None or after is None or before.admitted is None or after.admitted is None:
        return ""
    if after.engine != before.engine or after.process_started != before.process_started:
        return ""
    grown = after.admitted - before.admitted
    if grown <= 0:
        return ""
    return f"{admission_counter(after.engine)} +{grown:g} during the wait"


class _Bracket:
    """One probe's receiver and handle: its baseline read a quarter of its timeout in
    (none once its first token came), its result passed on, a timeout once both reads
    are over (or ``confirm_wait`` after it); cancelled: nothing is told."""

    __slots__ = (
        "_after",
        "_baseline",
        "_baseline_took",
        "_count",
        "_held",
        "_read_now",
        "_receiver",
        "_target",
        "_timer",
        "probe",
    )

    def __init__(
        self, target: ProbeTarget, receiver: ProbeReceiver, read_now: ReadNow, count: Count
    ) -> None:
        self._target = target
        self._receiver = receiver
        self._read_now = read_now
        self._count = count
        # Each read's load once it is over ([None]: it failed); None: not over (or, for
        # the baseline, never started).
        self._baseline: list[EngineLoad | None] | None = None
        self._baseline_took: float | None = None  # seconds, once the baseline is over
        self._after: list[EngineLoad | None] | None = None
        self._held: ProbeResult | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.probe: Started | None = None

    def arm(self) -> None:
        delay = BASELINE_AT * self._target.timeout_s
        self._timer = asyncio.get_running_loop().call_later(delay, self._take_baseline)

    def _take_baseline(self) -> None:
        self._timer = None
        taken: list[EngineLoad | None] = []
        clock = asyncio.get_running_loop().time
        sent = clock()

        def over(load: EngineLoad | None) -> None:
            self._baseline_took = clock() - sent
            self._over(taken, load)

        if self._read_now(self._target, over):
            self._baseline = taken

    def set(self) -> None:
        self._stop_timer()  # a first token: no baseline needed
        self._receiver.set()

    def done(self, result: ProbeResult) -> None:
        self._stop_timer()
        if result.outcome is not Outcome.TIMEOUT:
            self._receiver.done(result)
            return
        baseline = self._baseline
        if baseline is None or (baseline and baseline[0] is None):
            self._count(Evidence.NO_BASELINE)
            self._receiver.done(result)
            return
        self._held = result
        after: list[EngineLoad | None] = []
        self._after = after
        if not self._read_now(self._target, lambda load: self._over(after, load)):
            self._after = None
            self._tell(Evidence.NO_CONFIRM)
        elif self._held is not None:  # a read is under way
            wait = confirm_wait(self._baseline_took, self._target.timeout_s)
            self._timer = asyncio.get_running_loop().call_later(wait, self._tell, Evidence.LATE)

    def _over(self, taken: list[EngineLoad | None], load: EngineLoad | None) -> None:
        """One read is over: the timeout is told once both are."""
        taken.append(load)
        if self._held is None or not self._baseline or not self._after:
            return
        before, after = self._baseline[0], self._after[0]
        if before is None:
            self._tell(Evidence.NO_BASELINE)
        elif after is None:
            self._tell(Evidence.NO_CONFIRM)
        else:
            self._tell(Evidence.NONE, admitted_between(before, after))

    def failed(self, error: Exception) -> None:
        self._stop_timer()
        self._receiver.failed(error)

    def _tell(self, evidence: Evidence, admission: str = "") -> None:
        held, self._held = self._held, None
        self._stop_timer()
        if held is None:
            return
        self._count(Evidence.ADMISSION if admission else evidence)
        self._receiver.done(replace(held, admission=admission) if admission else held)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def cancel(self) -> None:
        self._held = None
        self._stop_timer()
        if self.probe is not None:
            self.probe.cancel()
