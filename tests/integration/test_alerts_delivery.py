"""Alert delivery against real webhook receivers (aiohttp servers on 127.0.0.1).

The component is fed real state-machine transitions through ``observe`` (as the runtime
does) and delivers with its real aiohttp client and tenacity retries. Clocks for dedup
and rate limiting are fake where the test is about them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from llm_health.alerts.component import AlertsComponent
from llm_health.alerts.settings import AlertsConfig, WebhookConfig
from llm_health.model.machine import Transition, initial_health, step
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State
from tests.alerts_receiver import Receiver
from tests.polling import wait_until_async
from tests.ports import free_port

SECRET = "s3cr3t-token-value"
POLICY = Policy(healthy_after=1, unhealthy_after=1)
MERGING = "merging parsed settings"  # config._MERGING: lets tests pass seconds as floats


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settings(*hooks: dict[str, Any], **more: Any) -> AlertsConfig:
    defaults: dict[str, Any] = {"retry_backoff": 0.02, "max_retry_time": 10.0}
    return AlertsConfig.model_validate(
        {
            "webhooks": [WebhookConfig.model_validate(h, context=MERGING) for h in hooks],
            **defaults,
            **more,
        },
        context=MERGING,
    )


def hook(url: str, **more: Any) -> dict[str, Any]:
    return {"url": url, "timeout": 2.0, "headers": {"Authorization": f"Bearer {SECRET}"}, **more}


class Endpoint:
    """One endpoint driven through the real state machine; ``probe`` feeds the
    component exactly what the runtime would (transitions that changed or alert)."""

    def __init__(self, component: AlertsComponent, address: str = "10.0.0.11:8000") -> None:
        self.component = component
        self.address = address
        self.health = replace(initial_health(0.0, POLICY), state=State.HEALTHY)
        self.t = 0.0

    def probe(self, outcome: Outcome, **more: Any) -> Transition:
        self.t += 1.0
        result = ProbeResult(outcome, started_at=1_700_000_000.0 + self.t, **more)
        transition = step(self.health, result, self.t, POLICY)
        self.health = transition.after
        if transition.changed or transition.alert:
            self.component.observe("llama-70b", self.address, transition, result)
        return transition


@pytest.fixture
async def receivers() -> AsyncIterator[Callable[..., Awaitable[Receiver]]]:
    started: list[Receiver] = []

    async def make(**kwargs: Any) -> Receiver:
        receiver = await Receiver(**kwargs).start()
        started.append(receiver)
        return receiver

    yield make
    for receiver in started:
        await receiver.stop()


@contextlib.asynccontextmanager
async def running(component: AlertsComponent) -> AsyncIterator[AlertsComponent]:
    jobs = [asyncio.create_task(job()) for job in component.tasks()]
    try:
        yield component
    finally:
        for job in jobs:
            job.cancel()
        for job in jobs:
            with contextlib.suppress(asyncio.CancelledError):
                await job


# --------------------------------------------------------------------------- acceptance


async def test_receiver_failing_twice_gets_exactly_one_delivery_per_event(
    receivers: Callable[..., Awaitable[Receiver]],
) -> None:
    """Delivery with retries (docs/design.md §5.5): 500, 500, then 200 for every event -> one delivery each."""
    receiver = await receivers(fail_first=2, fail_status=500)
    component = AlertsComponent(settings(hook(receiver.url)))
    endpoint = Endpoint(component)
    async with running(component):
        endpoint.probe(Outcome.TIMEOUT, connect_ms=0.3, headers_ms=None)  # -> UNHEALTHY
        endpoint.probe(Outcome.FAST, ttft_ms=40.0)  # -> HEALTHY: recovered
        endpoint.probe(Outcome.FATAL, status=500, detail="CUDA error")  # unhealthy + fatal
        delivered = await receiver.wait_accepted(3, within_s=15.0)
        await asyncio.sleep(0.3)  # nothing more may arrive
    assert len(receiver.accepted()) == 3
    assert [d["event"] for d in delivered] == ["unhealthy", "recovered", "fatal"]
    assert len({d["id"] for d in delivered}) == 3
    for body in delivered:
        assert receiver.attempts(body["id"]) == 3  # 2 failures + 1 success, no more
    assert len(receiver.requests) == 9
    # every attempt of one event carries the same id, in the body and in a header
    for request in receiver.requests:
        assert request.headers["X-LLM-Health-Event-Id"] == request.body["id"]
        assert request.headers["Authorization"] == f"Bearer {SECRET}"
        assert request.headers["Content-Type"] == "application/json"
    fatal = delivered[2]
    assert fatal["events"] == ["fatal", "unhealthy"]
    assert (fatal["cluster"], fatal["endpoint"]) == ("llama-70b", "10.0.0.11:8000")
    assert (fatal["previous"], fatal["state"]) == ("healthy", "unhealthy")
    assert fatal["reason"].startswith("fatal engine error: CUDA error")
    assert fatal["timings"]["outcome"] == "fatal"
    assert fatal["timings"]["status"] == 500
    assert delivered[1]["timings"]["ttft_ms"] == 40.0
    assert delivered[0]["timings"]["connect_ms"] == 0.3
    status = component.status()
    assert (status["sent"], status["retried"], status["failed"]) == (3, 6, 0)
    assert status["events"] == 3


async def test_a_4xx_is_not_retried_but_429_is(
    receivers: Callable[..., Awaitable[Receiver]],
) -> None:
    bad_request = await receivers(fail_first=10, fail_status=400)
    throttled = await receivers(fail_first=1, fail_status=429)
    component = AlertsComponent(settings(hook(bad_request.url), hook(throttled.url)))
    async with running(component):
        Endpoint(component).probe(Outcome.FATAL, detail="Xid 79")
        await throttled.wait_accepted(1, within_s=10.0)
        await wait_until_async(lambda: component.status()["failed"] == 1, 10.0, "the 400 to fail")
        await asyncio.sleep(0.3)
    assert len(bad_request.requests) == 1  # never retried
    assert [r.status for r in throttled.requests] == [429, 200]
    hooks = component.status()["webhooks"]
    assert (hooks[0]["failed"], hooks[0]["retried"], hooks[0]["sent"]) == (1, 0, 0)
    assert (hooks[1]["failed"], hooks[1]["retried"], hooks[1]["sent"]) == (0, 1, 1)


async def test_unreachable_webhook_gives_up_after_max_attempts_and_never_logs_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/services/T00/B00/{SECRET}"  # nobody listens
    component = AlertsComponent(
        settings(hook(url), max_attempts=3, retry_backoff=0.01, dedup_window=0.001)
    )
    caplog.set_level(logging.DEBUG, logger="llm_health")
    async with running(component):
        Endpoint(component).probe(Outcome.FATAL, detail="NCCL timeout")
        await wait_until_async(lambda: component.status()["failed"] == 1, 10.0, "giving up")
    status = component.status()
    assert (status["sent"], status["retried"], status["failed"]) == (0, 2, 1)
    text = caplog.text + repr(status)
    assert "alert not delivered" in caplog.text
    assert SECRET not in text
    assert "/services/" not in text  # the URL's path can be a token too
    assert status["webhooks"][0]["webhook"].startswith("#0 http://127.0.0.1:")


async def test_subscriptions_filter_events(receivers: Callable[..., Awaitable[Receiver]]) -> None:
    only_recovered = await receivers(path="/recovered")
    only_fatal = await receivers(path="/fatal")
    component = AlertsComponent(
        settings(
            hook(only_recovered.url, on=["recovered"]),
            hook(only_fatal.url, on=["fatal"]),
        )
    )
    endpoint = Endpoint(component)
    async with running(component):
        endpoint.probe(Outcome.TIMEOUT)  # unhealthy: neither
        endpoint.probe(Outcome.FAST)  # recovered
        endpoint.probe(Outcome.FATAL, detail="EngineDeadError")  # unhealthy + fatal
        await only_recovered.wait_accepted(1, within_s=10.0)
        await only_fatal.wait_accepted(1, within_s=10.0)
        await asyncio.sleep(0.3)
    assert [b["event"] for b in only_recovered.accepted()] == ["recovered"]
    assert [b["event"] for b in only_fatal.accepted()] == ["fatal"]


async def test_duplicates_within_the_window_are_sent_once(
    receivers: Callable[..., Awaitable[Receiver]],
) -> None:
    receiver = await receivers()
    clock = FakeClock()
    component = AlertsComponent(settings(hook(receiver.url), dedup_window=60.0), clock=clock)
    endpoint = Endpoint(component)
    async with running(component):
        endpoint.probe(Outcome.FATAL, detail="CUDA error")  # unhealthy + fatal: sent
        endpoint.probe(Outcome.ERROR)
        endpoint.probe(Outcome.FATAL, detail="CUDA error")  # fatal again within 60 s: dup
        clock.now += 61.0
        endpoint.probe(Outcome.ERROR)
        endpoint.probe(Outcome.FATAL, detail="CUDA error")  # after the window: sent
        await receiver.wait_accepted(2, within_s=10.0)
        await asyncio.sleep(0.3)
    assert [b["event"] for b in receiver.accepted()] == ["fatal", "fatal"]
    assert component.status()["deduplicated"] == 1
    assert component.status()["events"] == 3


async def test_rate_limit_summarises_the_excess(
    receivers: Callable[..., Awaitable[Receiver]],
) -> None:
    receiver = await receivers()
    clock = FakeClock()
    component = AlertsComponent(
        settings(hook(receiver.url), max_per_minute=2),
        clock=clock,
        summary_tick_s=0.05,
    )
    endpoints = [Endpoint(component, f"10.0.0.{i}:8000") for i in range(6)]
    async with running(component):
        for endpoint in endpoints:
            endpoint.probe(Outcome.TIMEOUT)  # six different endpoints go unhealthy
        await receiver.wait_accepted(2, within_s=10.0)
        await asyncio.sleep(0.3)
        assert len(receiver.accepted()) == 2  # the limit holds while the clock stands
        clock.now += 60.0
        delivered = await receiver.wait_accepted(3, within_s=10.0)
        await asyncio.sleep(0.3)
    assert len(receiver.accepted()) == 3
    summary = delivered[2]
    assert summary["event"] == "rate_limited"
    assert summary["suppressed"] == 4
    assert summary["by_event"] == {"unhealthy": 4}
    assert summary["endpoints"] == [f"llama-70b/10.0.0.{i}:8000" for i in range(2, 6)]
    status = component.status()
    assert (status["rate_limited"], status["summaries"], status["sent"]) == (4, 1, 3)


async def test_full_queue_drops_and_counts_and_observe_stays_instant(
    receivers: Callable[..., Awaitable[Receiver]],
) -> None:
    hanging = await receivers(hang=True)
    component = AlertsComponent(settings(hook(hanging.url, timeout=30.0), queue_size=2))
    endpoints = [Endpoint(component, f"10.0.1.{i}:8000") for i in range(10)]
    async with running(component):
        endpoints[0].probe(Outcome.TIMEOUT)
        await wait_until_async(lambda: len(hanging.requests) == 1, 5.0, "the first POST to hang")
        started = time.thread_time()  # CPU time: a preempted test waits, it does not work
        for endpoint in endpoints[1:]:
            endpoint.probe(Outcome.TIMEOUT)
        elapsed = time.thread_time() - started
        status = component.status()
    assert elapsed < 0.05, elapsed  # enqueue only, whatever the receiver does
    assert status["webhooks"][0]["queued"] == 2
    assert status["dropped"] == 7  # 9 offered while one hangs: 2 queued, 7 dropped
    assert status["sent"] == 0


async def test_observe_never_raises() -> None:
    component = AlertsComponent(settings(hook("http://127.0.0.1:9/x")))
    component.observe("c", "a", None, None)  # type: ignore[arg-type]
    assert component.status()["observer_errors"] == 1


async def test_no_webhooks_no_tasks_no_work() -> None:
    component = AlertsComponent(AlertsConfig())
    assert component.tasks() == []
    Endpoint(component).probe(Outcome.FATAL)
    assert component.status()["events"] == 0
