"""Webhook alerts: the runtime component that delivers ``llm_health.alerts`` events
(docs/design.md §5.5); its settings are ``alerts.settings``, what goes on the wire
``alerts.wire``.

Flow: the board control calls ``observe`` synchronously on the runtime's loop for every
transition (``BoardControl.on_transition``). ``observe`` only classifies, deduplicates,
rate-limits and enqueues: O(webhooks), never blocks, never raises. One worker task per
webhook drains that webhook's BOUNDED queue (full: the event is dropped and counted) and
POSTs the JSON payload with aiohttp, one delivery at a time, so a slow or dead receiver
delays only its own queue, never the prober nor the other webhooks.

Retries (tenacity): connection errors, timeouts, 5xx and 429 are retried with
exponential backoff and jitter, at most ``max_attempts`` attempts and ``max_retry_time``
in total; any other status (4xx, 3xx: redirects are not followed) fails at once. Every
attempt of one event carries the same ``id`` (also in the ``X-LLM-Health-Event-Id``
header) so a receiver can drop a repeat it already processed.

Secrets: webhook headers (``${ENV}``-expanded by the config loader) and the URL's path
and query (Slack-style URLs carry a token there) are never logged nor shown in /status;
a webhook is named by its index and ``scheme://host:port``. Every body is scrubbed of
every configured secret before it is queued (``ops.secret_scrubbing``): a reason or a
probe's detail may quote what a backend answered.
Shutdown: the workers are cancelled with the runtime; queued events are not flushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

import aiohttp
import grpc
from prometheus_client.metrics_core import Metric
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from llm_health.alerts import Deduplicator, RateLimiter, alert_event, classify, payload
from llm_health.alerts.events import AlertEvent, notice_event
from llm_health.alerts.settings import AlertsConfig, WebhookConfig
from llm_health.alerts.wire import encode, origin, request_headers
from llm_health.core.component import Job
from llm_health.core.control import BoardControl, Notice
from llm_health.core.families import gauge
from llm_health.model.machine import Transition
from llm_health.model.outcome import ProbeResult
from llm_health.ops.secret_scrubbing import Secrets

log = logging.getLogger("llm_health")
MAX_BACKOFF_S = 30.0
SUMMARY_TICK_S = 1.0


class DeliveryError(Exception):
    """One attempt failed. ``retryable``: worth another attempt (network, 5xx, 429)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


_STAT_NAMES = ("sent", "failed", "retried", "dropped", "rate_limited", "summaries")


class _Retryable(DeliveryError):
    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


@dataclass(slots=True)
class WebhookStats:
    """Per-webhook counters. ``sent``: messages accepted (2xx), summaries included;
    ``failed``: given up on; ``retried``: extra attempts; ``dropped``: queue full;
    ``rate_limited``: held back into a summary; ``summaries``: summaries sent."""

    sent: int = 0
    failed: int = 0
    retried: int = 0
    dropped: int = 0
    rate_limited: int = 0
    summaries: int = 0


@dataclass(frozen=True, slots=True)
class _Message:
    id: str
    kind: str  # event name, or "rate_limited" for a summary
    body: bytes


class Webhook:
    """One receiver: its settings, queue, rate limiter and counters. Loop-confined."""

    def __init__(self, index: int, settings: WebhookConfig, alerts: AlertsConfig) -> None:
        self.index = index
        self.settings = settings
        self.label = f"#{index} {origin(settings.url)}"
        self.subscribed = frozenset(settings.on)
        self.queue: asyncio.Queue[_Message] = asyncio.Queue(alerts.queue_size)
        self.limiter = RateLimiter(alerts.max_per_minute)
        self.stats = WebhookStats()

    def headers(self, event_id: str) -> dict[str, str]:
        secret = {k: v.get_secret_value() for k, v in self.settings.headers.items()}
        return request_headers(secret, event_id)

    def offer(self, message: _Message) -> bool:
        """Enqueue without waiting; False (and counted) when the queue is full."""
        try:
            self.queue.put_nowait(message)
        except asyncio.QueueFull:
            self.stats.dropped += 1
            return False
        return True

    def status(self) -> dict[str, Any]:
        return {
            "webhook": self.label,
            "on": sorted(self.subscribed),
            "queued": self.queue.qsize(),
            **asdict(self.stats),
        }


class AlertsComponent:
    """The ``alerts`` component (see module docstring). ``clock``: monotonic seconds for
    dedup and rate limits; ``wall_clock``: event times. Both injectable for tests.
    ``secrets``: the runtime's, scrubbed from every body."""

    name = "alerts"

    def __init__(
        self,
        settings: AlertsConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        summary_tick_s: float = SUMMARY_TICK_S,
        secrets: Secrets | None = None,
    ) -> None:
        self.settings = settings
        self._secrets = secrets if secrets is not None else Secrets()
        self._clock = clock
        self._wall_clock = wall_clock
        self._summary_tick_s = summary_tick_s
        self._dedup = Deduplicator(settings.dedup_window)
        self.webhooks = [Webhook(i, w, settings) for i, w in enumerate(settings.webhooks)]
        self.events = 0
        self.deduplicated = 0
        self.observer_errors = 0

    # --- the synchronous side: called by the runtime on its loop ---------------------------

    def observe(
        self, cluster: str, address: str, transition: Transition, result: ProbeResult | None
    ) -> None:
        """A ``BoardControl.on_transition`` observer: enqueue only; never raises."""
        try:
            self._observe(cluster, address, transition, result)
        except Exception:  # an alert bug must never break the prober
            self.observer_errors += 1
            log.exception("alerts: observer failed", extra={"cluster": cluster})

    def observe_notice(self, notice: Notice) -> None:
        """A ``BoardControl.on_notice`` observer (a cluster-level event): enqueue only."""
        try:
            event = notice_event(
                uuid.uuid4().hex, notice.kind, notice.cluster, notice.reason, self._wall_clock()
            )
            if event is not None:
                self._offer(event)
        except Exception:  # an alert bug must never break discovery
            self.observer_errors += 1
            log.exception("alerts: notice observer failed", extra={"cluster": notice.cluster})

    def _observe(
        self, cluster: str, address: str, transition: Transition, result: ProbeResult | None
    ) -> None:
        if not self.webhooks or not classify(transition, result):
            return  # the common case: not an alert, nothing allocated
        event = alert_event(
            uuid.uuid4().hex, cluster, address, transition, result, self._wall_clock()
        )
        if event is not None:
            self._offer(event)

    def _offer(self, event: AlertEvent) -> None:
        self.events += 1
        now = self._clock()
        if not self._dedup.admit(event, now):
            self.deduplicated += 1
            return
        names = {kind.value for kind in event.kinds}
        body = encode(self._secrets.scrub(payload(event)))
        for hook in self.webhooks:
            if not names & hook.subscribed:
                continue
            if not hook.limiter.admit(event, now):
                hook.stats.rate_limited += 1
                continue
            hook.offer(_Message(event.id, event.primary.value, body))

    # --- Component protocol ----------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        """No gRPC service."""

    def tasks(self) -> list[Job]:
        return [self.run] if self.webhooks else []

    def status(self) -> dict[str, Any]:
        totals = {name: sum(getattr(h.stats, name) for h in self.webhooks) for name in _STAT_NAMES}
        return {
            "events": self.events,
            "deduplicated": self.deduplicated,
            **totals,
            "observer_errors": self.observer_errors,
            "webhooks": [h.status() for h in self.webhooks],
        }

    def metrics(self) -> Iterator[Metric]:
        # Gauges, though they only grow: the type they were first exported with, which
        # dashboards and rules query.
        every = self._webhook_totals()
        yield gauge("llm_health_alerts_events", "Alert events raised.", self.events)
        yield gauge(
            "llm_health_alerts_deduplicated",
            "Alert events left out as repeats (alerts.dedup_window).",
            self.deduplicated,
        )
        yield gauge(
            "llm_health_alerts_sent",
            "Messages webhooks accepted (2xx), summaries included; all webhooks.",
            every.sent,
        )
        yield gauge("llm_health_alerts_failed", "Messages given up on; all webhooks.", every.failed)
        yield gauge(
            "llm_health_alerts_retried", "Extra delivery attempts; all webhooks.", every.retried
        )
        yield gauge(
            "llm_health_alerts_dropped",
            "Messages dropped: a webhook's queue was full (alerts.queue_size).",
            every.dropped,
        )
        yield gauge(
            "llm_health_alerts_rate_limited",
            "Messages held back into a summary (alerts.max_per_minute).",
            every.rate_limited,
        )
        yield gauge("llm_health_alerts_summaries", "Rate-limit summaries sent.", every.summaries)
        yield gauge(
            "llm_health_alerts_observer_errors",
            "Transitions or notices the alerts observer failed on (a bug; see the log).",
            self.observer_errors,
        )

    def _webhook_totals(self) -> WebhookStats:
        return WebhookStats(
            **{
                f.name: sum(getattr(h.stats, f.name) for h in self.webhooks)
                for f in fields(WebhookStats)
            }
        )

    # --- the asynchronous side: delivery -----------------------------------------------------

    async def run(self) -> None:
        """Deliver until cancelled: one worker per webhook, one shared HTTP session."""
        async with aiohttp.ClientSession(trust_env=False) as session, asyncio.TaskGroup() as tg:
            for hook in self.webhooks:
                tg.create_task(self._worker(session, hook), name=f"alerts-webhook-{hook.index}")

    async def _worker(self, session: aiohttp.ClientSession, hook: Webhook) -> None:
        while True:
            message = await self._next(hook)
            if message is None:
                continue
            try:
                await self.deliver(session, hook, message)
            except Exception:  # a bug here must not take the runtime's TaskGroup down
                hook.stats.failed += 1
                log.exception("alert delivery crashed", extra=_fields(hook, message))

    async def _next(self, hook: Webhook) -> _Message | None:
        """The next queued event; a pending rate-limit summary goes first once a slot is
        free. None: nothing to send this tick."""
        summary = hook.limiter.take_summary(self._clock(), self._wall_clock(), uuid.uuid4().hex)
        if summary is not None:
            hook.stats.summaries += 1
            return _Message(summary["id"], "rate_limited", encode(self._secrets.scrub(summary)))
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(hook.queue.get(), self._summary_tick_s)
        return None

    async def deliver(
        self, session: aiohttp.ClientSession, hook: Webhook, message: _Message
    ) -> bool:
        """POST ``message`` with retries; True when the receiver accepted it (2xx)."""

        def before_sleep(state: RetryCallState) -> None:
            hook.stats.retried += 1
            error = state.outcome.exception() if state.outcome else None
            log.info(
                "alert delivery failed, retrying",
                extra=_fields(hook, message, attempt=state.attempt_number, error=str(error)),
            )

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.settings.max_attempts)
            | stop_after_delay(self.settings.max_retry_time),
            wait=wait_exponential(multiplier=self.settings.retry_backoff, max=MAX_BACKOFF_S)
            + wait_random(0, self.settings.retry_backoff / 2),
            retry=retry_if_exception_type(_Retryable),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await _post(session, hook, message)
        except DeliveryError as exc:
            hook.stats.failed += 1
            log.warning("alert not delivered", extra=_fields(hook, message, error=str(exc)))
            return False
        hook.stats.sent += 1
        log.debug("alert delivered", extra=_fields(hook, message))
        return True


async def _post(session: aiohttp.ClientSession, hook: Webhook, message: _Message) -> None:
    """One attempt. Raises _Retryable (network, timeout, 5xx, 429) or DeliveryError."""
    timeout = aiohttp.ClientTimeout(total=hook.settings.timeout)
    try:
        async with session.post(
            hook.settings.url,
            data=message.body,
            headers=hook.headers(message.id),
            timeout=timeout,
            allow_redirects=False,
        ) as response:
            status = response.status
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise _Retryable(f"{type(exc).__name__}: {_safe_error(exc)}") from exc
    if 200 <= status < 300:
        return
    if status == 429 or status >= 500:
        raise _Retryable(f"HTTP {status}")
    raise DeliveryError(f"HTTP {status} (not retried)", retryable=False)


def attach(
    settings: AlertsConfig, control: BoardControl, secrets: Secrets | None = None
) -> AlertsComponent:
    """Build the component and subscribe it to every transition and notice."""
    component = AlertsComponent(settings, secrets=secrets)
    if component.webhooks:
        control.on_transition(component.observe)
        control.on_notice(component.observe_notice)
    return component


def _safe_error(exc: BaseException) -> str:
    """aiohttp errors may quote the full URL: keep only their class for those."""
    text = str(exc)
    return "" if "://" in text else text


def _fields(hook: Webhook, message: _Message, **more: Any) -> dict[str, Any]:
    return {"webhook": hook.label, "alert_id": message.id, "alert": message.kind, **more}
