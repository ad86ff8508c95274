"""Known-answer probes (docs/design.md §14.1): every ``verify.every`` one of an
endpoint's scheduled probes is a known-answer probe (``Prober.start_verify``; its TTFT
counts as any probe's). The answer is judged (``engines.verify.Verifier``) before the
result is told; garbage holds the endpoint UNHEALTHY at once, ``unhealthy_after`` misses
(re-checked after ``confirm_delay``, inside the same slot) likewise; a passing answer
lifts the hold. The hold is the board's "verify" signal, so recovery then takes the
usual hysteresis."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llm_health.core.control import BoardControl
from llm_health.engines.board_signal import set_signal
from llm_health.engines.book import Book
from llm_health.engines.schedule import next_after
from llm_health.engines.settings import VerifyConfig
from llm_health.engines.verdicts import VERIFY_SIGNAL, Changes, verify_change
from llm_health.engines.verify import Judgement, Verdict, Verifier
from llm_health.model.outcome import ProbeResult
from llm_health.model.redact import printable_line
from llm_health.probe.client import Prober
from llm_health.probe.signals import ProbeReceiver, Started, Starter
from llm_health.probe.target import ProbeTarget

log = logging.getLogger("llm_health")


class KnownAnswers:
    """When an endpoint's next probe is a known-answer probe, and the judging of its
    answers into the board's "verify" signal."""

    def __init__(self, control: BoardControl, book: Book, clock: Callable[[], float]) -> None:
        self._control = control
        self._book = book
        self._clock = clock
        self._verifier = Verifier()
        self._members: dict[str, set[str]] = {}

    def set_targets(self, targets: list[ProbeTarget]) -> None:
        """The endpoints probed here, per cluster: the consensus's voters."""
        self._members = {}
        for target in targets:
            self._members.setdefault(target.cluster, set()).add(target.address)

    def forget(self, pairs: set[tuple[str, str]]) -> None:
        self._verifier.forget(pairs)

    def status(self, cluster: str) -> dict[str, object]:
        return self._verifier.status(cluster)

    # --- the probe path -----------------------------------------------------------------

    def starter(self, prober: Prober) -> Starter:
        """The scheduler's probe, started (``probe.signals``): the plain probe through
        ``prober.start_probe``, a known-answer probe when one is due through
        ``_KnownAnswer``; neither in a task of its own (every endpoint's first probe is a
        known-answer probe: at 5,000 endpoints, thousands at once)."""

        def start(target: ProbeTarget, receiver: ProbeReceiver) -> Started:
            verify = self.due(target)
            if verify is None:
                return prober.start_probe(target, receiver)
            return _KnownAnswer(self, prober, target, verify, receiver)

        return start

    def due(self, target: ProbeTarget) -> VerifyConfig | None:
        """The endpoint's ``probe.verify`` when its next probe is a known-answer probe."""
        verify = self._book.verify(target)
        if verify is None or self._clock() < self._book.endpoint(target.key).verify_due:
            return None
        return verify

    def begins(self, target: ProbeTarget, verify: VerifyConfig) -> None:
        """A known-answer probe of ``target`` starts: the next one is due ``verify.every``
        later (the first, sooner by the endpoint's hash: no burst)."""
        state = self._book.endpoint(target.key)
        first = state.verify_due == 0.0
        state.verify_due = self._clock() + next_after(target.key, verify.every, first=first)

    def judge(self, target: ProbeTarget, verify: VerifyConfig, result: ProbeResult) -> bool:
        """Judge ``result``'s answer and apply the verdicts; True if this endpoint's own
        answer asks for a re-check now."""
        if result.answer is None:
            return False
        self._book.counters.checks_total += 1
        members = self._members.get(target.cluster, set())
        judgements = self._verifier.judge(
            target.cluster,
            target.address,
            result.answer,
            verify,
            target.unhealthy_after,
            self._clock(),
            members,
        )
        self._book.endpoint(target.key).last_answer = printable_line(result.answer.text, 200)
        self._apply(target, judgements)
        return any(j.address == target.address and j.recheck for j in judgements)

    def _apply(self, target: ProbeTarget, judgements: list[Judgement]) -> None:
        changes: Changes = {}
        for judgement in judgements:
            self._count(judgement)
            state = self._book.endpoint(f"{target.cluster}/{judgement.address}")
            state.last_verdict = f"{judgement.verdict.value}: {judgement.reason}"
            if judgement.recheck and judgement.address != target.address:
                state.verify_due = 0.0  # its next probe re-checks
            change = verify_change(judgement)
            if change is not None:
                changes[judgement.address] = change
            if judgement.down:
                log.warning(
                    "known-answer check failed",
                    extra={
                        "cluster": target.cluster,
                        "endpoint": judgement.address,
                        "reason": judgement.reason,
                    },
                )
        set_signal(self._control, target.cluster, VERIFY_SIGNAL, changes)

    def _count(self, judgement: Judgement) -> None:
        counters = self._book.counters
        if judgement.verdict is Verdict.GARBAGE:
            counters.garbage_total += 1
        elif judgement.verdict is Verdict.MISS:
            counters.misses_total += 1
        elif judgement.verdict is Verdict.PASS:
            counters.passes_total += 1


class _Asking:
    """``_KnownAnswer._asking`` while ``start_verify`` runs."""

    def cancel(self) -> None:
        return None


_ASKING = _Asking()


class _KnownAnswer:
    """One known-answer probe (started by ``KnownAnswers.starter``; awaited, where a
    caller waits, through ``probe.signals.await_started``): asked through ``Prober.start_verify``, judged when its result comes, asked
    again after ``confirm_delay`` while a miss may still decide (at most
    ``unhealthy_after`` answers per slot), then its last result to the receiver. Driven by
    the answers' callbacks and one timer: no task, no coroutine frames held while the
    engine answers."""

    __slots__ = ("_answers", "_asking", "_left", "_prober", "_receiver", "_target", "_verify")

    def __init__(
        self,
        answers: KnownAnswers,
        prober: Prober,
        target: ProbeTarget,
        verify: VerifyConfig,
        receiver: ProbeReceiver,
    ) -> None:
        self._answers = answers
        self._prober = prober
        self._target = target
        self._verify = verify
        self._receiver = receiver
        self._left = target.unhealthy_after - 1  # re-checks allowed in this slot
        self._asking: Started | asyncio.TimerHandle | _Asking | None = None
        answers.begins(target, verify)
        self._ask()

    def _ask(self) -> None:
        self._asking = _ASKING
        started = self._prober.start_verify(self._target, self._verify, self)
        if self._asking is _ASKING:  # else its result came already, within the call
            self._asking = started

    # --- ProbeReceiver: what the known-answer probe in flight tells -------------------

    def set(self) -> None:
        self._receiver.set()  # each answer's first token: the scheduler's silence watch

    def done(self, result: ProbeResult) -> None:
        self._asking = None
        try:
            again = self._answers.judge(self._target, self._verify, result)
        except Exception as error:  # a bug of ours: the scheduler's to report
            self._receiver.failed(error)
            return
        if again and self._left > 0:
            self._left -= 1
            loop = asyncio.get_running_loop()
            self._asking = loop.call_later(self._target.confirm_delay_s, self._ask)
            return
        self._receiver.done(result)

    def failed(self, error: Exception) -> None:
        self._asking = None
        self._receiver.failed(error)

    # --- Started --------------------------------------------------------------------------

    def cancel(self) -> None:
        asking, self._asking = self._asking, None
        if asking is not None:
            asking.cancel()
