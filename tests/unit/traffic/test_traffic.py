"""Passive health's pure parts (traffic/*): access-log entries, the rolling window, the
quality verdict, the busy rule, TTFT deltas, and the stream's flood budget."""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2

from llm_health.traffic.busy import skip
from llm_health.traffic.entries import Request, decode
from llm_health.traffic.quality import note, verdict
from llm_health.traffic.settings import BusyConfig, QualityConfig
from llm_health.traffic.stream import LOG_EVERY_S, LogStreams
from llm_health.traffic.ttft import delta
from llm_health.traffic.window import Recent, Summary, Window, quantile


def entry(
    address: str = "10.0.0.1",
    port: int = 8000,
    status: int | None = 200,
    duration_ms: int = 120,
    **flags: bool,
) -> accesslog_pb2.HTTPAccessLogEntry:
    found = accesslog_pb2.HTTPAccessLogEntry()
    common = found.common_properties
    common.upstream_cluster = "llama"
    common.upstream_remote_address.socket_address.address = address
    common.upstream_remote_address.socket_address.port_value = port
    common.duration.FromMilliseconds(duration_ms)
    common.time_to_first_upstream_rx_byte.FromMilliseconds(30)
    common.upstream_request_attempt_count = 1
    for name, value in flags.items():
        setattr(common.response_flags, name, value)
    if status is not None:
        found.response.response_code.value = status
    return found


# --- entries -------------------------------------------------------------------------


def test_a_success_is_decoded_with_its_timings() -> None:
    request = decode(entry())
    assert request == Request("llama", "10.0.0.1:8000", 200, False, 0.12, 0.03, 1, ())
    assert request.success


@pytest.mark.parametrize(
    ("made", "error", "success"),
    [
        (entry(status=503), True, False),
        (entry(status=429), False, True),  # the client's problem, not an engine failure
        (entry(status=None, upstream_remote_reset=True), True, False),
        (entry(status=504, upstream_request_timeout=True), True, False),
        (entry(status=None, upstream_connection_failure=True), True, False),
        (entry(status=None, downstream_remote_reset=True), False, False),  # user went away
    ],
)
def test_errors_are_5xx_resets_and_timeouts(made: Any, error: bool, success: bool) -> None:
    request = decode(made)
    assert request is not None and request.error is error and request.success is success


def test_probes_intermediate_entries_and_unknown_hosts_do_not_count() -> None:
    probe = entry()
    probe.request.request_headers["x-llm-probe"] = "true"
    assert decode(probe) is None
    periodic = entry()
    periodic.common_properties.intermediate_log_entry = True
    assert decode(periodic) is None
    assert decode(entry(address="")) is None
    assert decode(entry(address="not-an-ip")) is None
    assert decode(entry(port=0)) is None
    six = decode(entry(address="fd00::1"))
    assert six is not None and six.address == "[fd00::1]:8000"


def test_absurd_durations_are_refused() -> None:
    broken = entry()
    broken.common_properties.duration.seconds = 10**9
    assert decode(broken) is None


# --- window --------------------------------------------------------------------------


def test_the_window_counts_requests_and_errors_and_forgets_old_slots() -> None:
    window = Window(60.0, long_after_s=0.8)
    for i in range(100):
        window.add(1000.0 + i * 0.1, success=i % 20 != 0, error=i % 20 == 0, duration_s=0.1)
    summary = window.summary(1010.0)
    assert (summary.requests, summary.errors) == (100, 5)
    assert summary.error_rate == 0.05
    assert window.summary(1000.0 + 60 + 10).requests == 0  # a minute later: all gone


def test_a_window_is_empty_exactly_when_its_counts_are_all_zero() -> None:
    """The judge skips an empty window (``Window.empty``): it must be empty exactly when a
    summary would find nothing, whatever was added when."""
    rng = random.Random(7)
    for _ in range(200):
        window = Window(rng.choice([1.0, 15.0, 60.0]), long_after_s=0.8)
        now = rng.uniform(0, 1e4)
        assert window.empty(now)
        for _ in range(rng.randint(0, 6)):
            now += rng.expovariate(1 / window.window_s)
            if rng.random() < 0.5:
                window.add(now, success=True, error=False, duration_s=0.1)
            else:
                window.add_ttft(now, [0.1, math.inf], [1, 0])
            later = now + rng.uniform(0, 2 * window.window_s)
            counts = window.counts(later)
            nothing = counts.requests == 0 and sum(counts.ttft) == 0
            assert window.empty(later) is nothing, (window.window_s, now, later)


def test_quantiles_interpolate_inside_buckets_like_prometheus() -> None:
    bounds = (0.1, 0.5, 1.0, math.inf)
    assert quantile(bounds, [0, 10, 0, 0], 0.5) == pytest.approx(0.3)
    assert quantile(bounds, [90, 0, 10, 0], 0.95) == pytest.approx(0.75)
    assert quantile(bounds, [0, 0, 0, 4], 0.95) == 1.0  # +Inf: its lower bound
    assert quantile(bounds, [0, 0, 0, 0], 0.5) is None


def test_ttft_deltas_go_into_the_window_and_new_bounds_restart_them() -> None:
    window = Window(60.0, long_after_s=0.8)
    bounds = (0.1, 1.0, 2.5, math.inf)
    window.add_ttft(10.0, bounds, [0, 0, 60, 0])
    summary = window.summary(11.0)
    assert summary.ttft_count == 60 and summary.p95_ttft_s is not None
    assert 1.0 < summary.p95_ttft_s <= 2.5
    window.add_ttft(12.0, (0.5, math.inf), [3, 0])
    assert window.summary(12.0).ttft_count == 3


def test_recent_counts_the_last_interval_to_a_quarter_second() -> None:
    window = Window(60.0, long_after_s=0.8)
    for i in range(12):
        window.add(100.2 + i * 0.05, success=True, error=False, duration_s=0.2)
    window.add(100.9, success=True, error=False, duration_s=2.0)
    # The interval: the current quarter second and the three before it ([100.25, 101.25)).
    assert window.recent(101.1, 1.0) == Recent(12, 0, 1, 2)
    # 0.6 s after the last completion: two still in the interval, none in the last half
    # second (a zombie: requests stopped completing).
    assert window.recent(101.5, 1.0) == Recent(2, 0, 1, 0)
    assert window.recent(105.0, 1.0) == Recent(0, 0, 0, 0)


# --- quality -------------------------------------------------------------------------

LIMITS = QualityConfig(window="60s", min_requests=50, max_error_rate=0.01, max_p95_ttft="800ms")


def summary(requests: int, errors: int, ttft_count: int = 0, p95: float | None = None) -> Summary:
    return Summary(60.0, requests, errors, None, ttft_count, None, p95)


@pytest.mark.parametrize(
    ("found", "reason"),
    [
        (summary(412, 13), "error rate 3.2 % over 60 s (412 requests)"),
        (summary(49, 20), None),  # too few requests for a verdict
        (summary(1000, 10), None),  # exactly 1 %: not over
        (summary(100, 0, 100, 1.2), "p95 TTFT 1.20 s > 800 ms over 60 s (100 requests)"),
        (summary(100, 0, 30, 1.2), None),  # too few TTFT observations
        (summary(100, 0, 100, 0.5), None),
    ],
)
def test_quality_verdicts(found: Summary, reason: str | None) -> None:
    assert verdict(found, LIMITS) == reason


def test_the_note_says_why_there_is_no_verdict() -> None:
    assert note(summary(12, 0), LIMITS) == "no verdict: 12 requests, 50 needed"
    assert note(summary(100, 0), LIMITS) == "within limits"


# --- busy ----------------------------------------------------------------------------

BUSY = BusyConfig(min_requests=10, every=5)


@pytest.mark.parametrize(
    ("recent", "in_a_row", "healthy", "skipped"),
    [
        (Recent(20, 0, 0, 3), 0, True, True),
        (Recent(20, 0, 0, 3), 3, True, True),
        (Recent(20, 0, 0, 3), 4, True, False),  # every 5th slot is probed anyway
        (Recent(9, 0, 0, 3), 0, True, False),  # silence: too few requests
        (Recent(20, 0, 0, 0), 0, True, False),  # none completing right now (a zombie)
        (Recent(20, 1, 0, 3), 0, True, False),  # any error
        (Recent(20, 0, 1, 3), 0, True, False),  # a request that outlived the probe timeout
        (Recent(20, 0, 0, 3), 0, False, False),  # never for an endpoint that is not HEALTHY
    ],
)
def test_busy_rule(recent: Recent, in_a_row: int, healthy: bool, skipped: bool) -> None:
    assert skip(recent, BUSY, in_a_row, healthy) is skipped


# --- TTFT deltas ---------------------------------------------------------------------


def test_ttft_delta_removes_our_probes_and_spots_a_restart() -> None:
    bounds = (0.1, 1.0, math.inf)
    counts = delta(bounds, (10, 20, 21), (15, 40, 42), probes_s=(0.05, 0.06))
    assert counts == [3, 15, 1]
    assert delta(bounds, (10, 20, 21), (1, 2, 2)) is None  # counters went back
    assert delta(bounds, (0, 0, 0), (0, 0, 0), probes_s=(0.05,)) == [0, 0, 0]  # never negative
    assert delta(bounds, (1, 2), (1, 2, 3)) is None


# --- the stream ----------------------------------------------------------------------


async def messages(batches: int, per_batch: int) -> AsyncIterator[Any]:
    message = als_pb2.StreamAccessLogsMessage()
    message.identifier.node.id = "gw-1"
    message.http_logs.log_entry.extend([entry()] * per_batch)
    for _ in range(batches):
        yield message


async def test_a_stream_over_its_budget_drops_and_counts_never_queues() -> None:
    seen: list[Request] = []
    clock = [100.0]
    streams = LogStreams(lambda request, _now: seen.append(request), lambda: clock[0], max_rate=500)
    await streams.consume(messages(4, 200), "ipv4:127.0.0.1:1")
    stats = streams.stats
    assert stats.entries_total == 800 and stats.counted_total == 500
    assert stats.dropped_total == 300 and len(seen) == 500 and stats.streams_open == 0


async def test_a_peer_flooding_many_streams_logs_one_line_per_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Over budget on 10 streams of 100 messages each, from one host: one line (with how
    many were left out) per LOG_EVERY_S for that host, whatever its streams."""
    clock = [100.0]
    streams = LogStreams(lambda _r, _n: None, lambda: clock[0], max_rate=10)
    with caplog.at_level(logging.WARNING, logger="llm_health"):
        for port in range(10):
            await streams.consume(messages(100, 20), f"ipv4:192.0.2.7:{40000 + port}")
        clock[0] += LOG_EVERY_S
        await streams.consume(messages(2, 20), "ipv4:192.0.2.7:50000")
        await streams.consume(messages(2, 20), "ipv4:192.0.2.8:50000")  # another host
    lines = [r for r in caplog.records if "over its budget" in r.getMessage()]
    assert [(r.peer, r.suppressed) for r in lines] == [  # type: ignore[attr-defined]
        ("ipv4:192.0.2.7:40000", 0),
        ("ipv4:192.0.2.7:50000", 999),
        ("ipv4:192.0.2.8:50000", 0),
    ]
    assert streams.stats.dropped_total == 10 * (100 * 20 - 10) + 2 * (2 * 20 - 10)


async def test_the_stream_yields_to_the_loop_while_it_reads() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    streams = LogStreams(lambda _r, _n: None, lambda: 0.0)
    await streams.consume(messages(1, 2000), "peer")
    task.cancel()
    assert ticks >= 2000 // 50 - 1
