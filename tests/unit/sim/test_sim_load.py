"""The simulator's ``affects`` knob, its latency histograms and ``slow_under_load`` under
a steady load (the formula of :mod:`llm_health.sim.load`, and a short real run)."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_health.cli.sim import settings_from_args
from llm_health.sim.faults import FaultSpec
from llm_health.sim.histogram import E2E_BUCKETS, TTFT_BUCKETS, LatencyHistogram
from llm_health.sim.load import slow_under_load_ttft
from llm_health.sim.metrics import render_metrics
from llm_health.sim.server import SimHandle, SimSettings, running_sim
from llm_health.sim.state import SimState
from tests.polling import wait_until_async
from tests.unit.sim.test_sim import PROBE_HEADERS, completion, parse, set_fault, token_of

VLLM_TTFT_BOUNDS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        yield client


async def status_of(
    session: aiohttp.ClientSession, sim: SimHandle, probe: bool, **extra: Any
) -> int:
    headers = PROBE_HEADERS if probe else {}
    body = completion(stream=False, **extra)
    async with session.post(f"{sim.base_url}/v1/completions", json=body, headers=headers) as resp:
        await resp.read()
        return resp.status


async def timed_stream(
    session: aiohttp.ClientSession, sim: SimHandle, probe: bool, max_tokens: int = 1
) -> tuple[float, float]:
    """Seconds from sending a streamed completion to its first token, and to its end."""
    headers = PROBE_HEADERS if probe else {}
    body = completion(max_tokens=max_tokens)
    started = time.monotonic()
    seen: float | None = None
    async with session.post(f"{sim.base_url}/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        async for raw in resp.content:
            if seen is None and raw.startswith(b"data: ") and token_of(raw[6:].decode().strip()):
                seen = time.monotonic() - started
    assert seen is not None, "no token"
    return seen, time.monotonic() - started


async def first_token_after(
    session: aiohttp.ClientSession, sim: SimHandle, probe: bool, max_tokens: int = 1
) -> float:
    """Seconds from sending a streamed completion to its first token (read to the end)."""
    return (await timed_stream(session, sim, probe, max_tokens))[0]


# ---------------------------------------------------------------- affects: the knob


def test_affects_defaults_to_all_and_round_trips() -> None:
    assert FaultSpec().affects == "all"
    assert FaultSpec().to_json()["affects"] == "all"
    spec = FaultSpec.from_json({"fault": "http_500", "fault_rate": 0.05, "affects": "users"})
    assert (spec.fault, spec.fault_rate, spec.affects) == ("http_500", 0.05, "users")
    assert spec.to_json()["affects"] == "users"
    assert FaultSpec.from_json(spec.to_json()) == spec
    assert FaultSpec.from_json({"fault": "none"}, base=spec).affects == "users"  # merges


@pytest.mark.parametrize("value", ["probes", "USERS", "", 1, None, True, ["users"]])
def test_affects_refuses_anything_else_naming_the_key(value: object) -> None:
    with pytest.raises(ValueError, match='"affects"'):
        FaultSpec.from_json({"affects": value})
    if isinstance(value, str):
        with pytest.raises(ValueError, match='"affects"'):
            FaultSpec(affects=value)


def test_cli_affects_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert settings_from_args(parse(["sim", "--port", "9000"])).fault.affects == "all"
    args = parse(["sim", "--port", "9000", "--fault", "http_500", "--affects", "users"])
    assert settings_from_args(args).fault == FaultSpec(fault="http_500", affects="users")
    with pytest.raises(SystemExit) as exit_info:
        parse(["sim", "--port", "9000", "--affects", "probes"])
    assert exit_info.value.code == 2
    assert "--affects" in capsys.readouterr().err


def test_choose_fault_spares_probes_only_with_affects_users() -> None:
    state = SimState(SimSettings(seed=1))
    users_only = FaultSpec(fault="http_500", affects="users")
    everyone = FaultSpec(fault="http_500")
    assert state.choose_fault(users_only, is_probe=True) == "none"
    assert state.choose_fault(users_only, is_probe=False) == "http_500"
    assert state.choose_fault(everyone, is_probe=True) == "http_500"
    assert state.choose_fault(everyone) == "http_500"


# ---------------------------------------------------------------- affects: over HTTP


async def test_affects_users_serves_probes_and_fails_users(
    session: aiohttp.ClientSession,
) -> None:
    spec = FaultSpec(fault="http_500", ttft=0.0, tpot=0.0, affects="users")
    async with running_sim(SimSettings(fault=spec)) as sim:
        assert [await status_of(session, sim, probe=True) for _ in range(3)] == [200] * 3
        assert await status_of(session, sim, probe=False) == 500
        counters = sim.state.counters
        assert (counters.requests, counters.probe_requests, counters.faulted) == (4, 3, 1)
        faults = [(r["probe"], r["fault"]) for r in sim.state.recent]
        assert faults == [(True, "none")] * 3 + [(False, "http_500")]
        # Back to "all" (POST merges): the probe is failed again.
        await set_fault(session, sim, affects="all")
        assert await status_of(session, sim, probe=True) == 500


@pytest.mark.parametrize(
    "fault", ["hang_before_headers", "cuda_error", "overloaded", "startup_delay", "garbage_tokens"]
)
async def test_affects_users_spares_probes_whatever_the_fault(
    fault: str, session: aiohttp.ClientSession
) -> None:
    spec = FaultSpec(fault=fault, ttft=0.0, tpot=0.0, affects="users")
    async with running_sim(SimSettings(fault=spec)) as sim:
        url = f"{sim.base_url}/v1/completions"
        async with session.post(url, json=completion(), headers=PROBE_HEADERS) as resp:
            assert resp.status == 200
            text = await resp.text()
        assert '"text":" Paris"' in text and text.endswith("data: [DONE]\n\n")
        assert sim.state.counters.faulted == 0


async def test_fault_rate_draws_only_for_users_with_affects_users(
    session: aiohttp.ClientSession,
) -> None:
    """Probes take no draw: the seeded user outcomes are the same with or without
    probes in between, and probes are never failed (a 5 % flapping seen by users only)."""
    spec = FaultSpec(fault="http_500", fault_rate=0.3, ttft=0.0, tpot=0.0, affects="users")

    async def user_statuses(with_probes: bool) -> list[int]:
        async with running_sim(SimSettings(fault=spec, seed=7)) as sim:
            statuses = []
            for _ in range(30):
                if with_probes:
                    assert await status_of(session, sim, probe=True) == 200
                statuses.append(await status_of(session, sim, probe=False))
            return statuses

    alone, interleaved = await user_statuses(False), await user_statuses(True)
    assert alone == interleaved
    assert 0 < alone.count(500) < 30


async def test_slow_under_load_affects_users_lets_probes_through_fast(
    session: aiohttp.ClientSession,
) -> None:
    spec = FaultSpec(
        fault="slow_under_load", ttft=0.02, tpot=0.05, load_ttft_per_request=0.15, affects="users"
    )
    async with running_sim(SimSettings(fault=spec)) as sim:

        async def long_stream() -> None:
            async with session.post(
                f"{sim.base_url}/v1/completions", json=completion(max_tokens=20)
            ) as resp:
                await resp.read()

        background = [asyncio.create_task(long_stream()) for _ in range(2)]
        await wait_until_async(lambda: sim.state.in_flight == 2, 5, "two users in flight")
        probe = await first_token_after(session, sim, probe=True)
        user = await first_token_after(session, sim, probe=False)
        await set_fault(session, sim, affects="all")
        slowed_probe = await first_token_after(session, sim, probe=True)
        await asyncio.gather(*background)
    assert probe < 0.12  # base 20 ms; 2 users in flight would add 300 ms
    assert user >= 0.32  # 20 ms + 2 x 150 ms
    assert slowed_probe >= 0.32  # affects "all": the probe queues too


# ---------------------------------------------------------------- histograms


def test_histogram_buckets_are_vllms() -> None:
    assert list(TTFT_BUCKETS) == VLLM_TTFT_BOUNDS
    assert E2E_BUCKETS[:4] == (0.3, 0.5, 0.8, 1.0) and E2E_BUCKETS[-1] == 7680.0


def test_histogram_counts_are_cumulative_with_inclusive_bounds() -> None:
    histogram = LatencyHistogram((0.1, 1.0))
    for value in (0.1, 0.2, 1.0, 3.0, -1.0):
        histogram.observe(value)
    assert histogram.cumulative() == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]
    assert (histogram.count, histogram.sum) == (5, pytest.approx(4.3))
    histogram.reset()
    assert histogram.cumulative() == [("0.1", 0), ("1.0", 0), ("+Inf", 0)]
    assert (histogram.count, histogram.sum) == (0, 0.0)
    for bad in ((), (1.0, 0.5), (0.5, 0.5), (1.0, math.inf)):
        with pytest.raises(ValueError, match="buckets"):
            LatencyHistogram(bad)


def histograms(text: str) -> dict[str, dict[str, Any]]:
    """Every histogram family of a document, parsed by prometheus_client: per name its
    buckets ``{le: count}``, ``sum`` and ``count``; labels checked on the way."""
    found: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        entry: dict[str, Any] = {"buckets": {}}
        for sample in family.samples:
            labels = dict(sample.labels)
            le = labels.pop("le", None)
            assert labels == {"model_name": "sim-model"}, sample
            if sample.name == f"{family.name}_bucket":
                entry["buckets"][le] = sample.value
            else:
                entry[sample.name.removeprefix(family.name + "_")] = sample.value
        found[family.name] = entry
    return found


def assert_all_within(histogram: dict[str, Any], seconds: float) -> None:
    """Every bucket whose bound is ``seconds`` or more holds every observation."""
    count = histogram["count"]
    within = {le: n for le, n in histogram["buckets"].items() if float(le) >= seconds}
    assert within and all(n == count for n in within.values()), (seconds, histogram)


async def test_metrics_export_the_ttft_histogram_of_what_was_served(
    session: aiohttp.ClientSession,
) -> None:
    spec = FaultSpec(ttft=0.12, tpot=0.01, affects="users")
    async with running_sim(SimSettings(fault=spec)) as sim:
        started = time.monotonic()
        first = await first_token_after(session, sim, probe=True)  # probes are observed too
        await first_token_after(session, sim, probe=False, max_tokens=3)
        assert await status_of(session, sim, probe=False, max_tokens=2) == 200  # not streamed
        served_s = time.monotonic() - started  # the three, one after another, as we saw them
        await set_fault(session, sim, fault="http_500")  # no token: no TTFT
        assert await status_of(session, sim, probe=False) == 500
        async with session.get(f"{sim.base_url}/metrics") as resp:
            text = await resp.text()
    found = histograms(text)
    ttft = found["vllm:time_to_first_token_seconds"]
    assert list(ttft["buckets"]) == [*(repr(b) for b in VLLM_TTFT_BOUNDS), "+Inf"]
    assert ttft["count"] == 3
    assert ttft["buckets"]["0.1"] == 0  # every TTFT waited 120 ms
    # No observation lasted longer than the three requests took as the client saw them
    # (beside other tests, a request may take longer than its 120 ms plus tokens).
    assert_all_within(ttft, served_s)
    assert 0.36 <= ttft["sum"] <= served_s
    assert first >= 0.12
    e2e = found["vllm:e2e_request_latency_seconds"]
    assert e2e["count"] == 3  # the three completed requests, not the 500
    assert_all_within(e2e, served_s)
    assert 0.12 * 3 + 0.01 * (1 + 3 + 1) <= e2e["sum"] <= served_s
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="sim-model",le="+Inf"} 3.0' in text


async def test_ttft_is_observed_when_the_first_token_is_written(
    session: aiohttp.ClientSession,
) -> None:
    """Observed once per request, at its first token: not again at later tokens, and
    not at the end of the stream."""
    async with running_sim(SimSettings(fault=FaultSpec(ttft=0.0, tpot=0.1))) as sim:
        url = f"{sim.base_url}/v1/completions"
        async with session.post(url, json=completion(max_tokens=5)) as resp:
            await resp.content.readline()  # the first token
            await wait_until_async(lambda: sim.state.ttft.count == 1, 5, "TTFT observed")
            assert sim.state.e2e.count == 0
            await resp.read()
        assert sim.state.ttft.count == 1 and sim.state.e2e.count == 1
        assert sim.state.ttft.sum < 0.09 and sim.state.e2e.sum >= 0.5


async def test_aborted_streams_are_not_in_the_e2e_histogram(
    session: aiohttp.ClientSession,
) -> None:
    async with running_sim(SimSettings(fault=FaultSpec(ttft=0.0, tpot=0.2))) as sim:
        url = f"{sim.base_url}/v1/completions"
        async with session.post(url, json=completion(max_tokens=5)) as resp:
            await resp.content.readline()
            resp.close()
        await wait_until_async(lambda: sim.state.counters.aborted == 1, 2.0, "abort counted")
        assert (sim.state.ttft.count, sim.state.e2e.count) == (1, 0)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_histograms_parse_and_follow_the_engine(engine: str) -> None:
    state = SimState(SimSettings(engine=engine))
    for seconds in (0.0005, 0.05, 0.05, 1.2, 3000.0):
        state.ttft.observe(seconds)
    state.e2e.observe(0.6)
    found = histograms(render_metrics(state))
    assert set(found) == {
        f"{engine}:time_to_first_token_seconds",
        f"{engine}:e2e_request_latency_seconds",
    }
    ttft = found[f"{engine}:time_to_first_token_seconds"]
    assert (ttft["count"], ttft["sum"]) == (5, pytest.approx(3001.3005))
    buckets = ttft["buckets"]
    assert (buckets["0.001"], buckets["0.04"], buckets["0.06"]) == (1, 1, 3)
    assert (buckets["1.0"], buckets["2.5"], buckets["2560.0"], buckets["+Inf"]) == (3, 4, 4, 5)
    counts = list(buckets.values())
    assert counts == sorted(counts)  # cumulative
    e2e = found[f"{engine}:e2e_request_latency_seconds"]
    assert (e2e["buckets"]["0.5"], e2e["buckets"]["0.8"], e2e["count"]) == (0, 1, 1)


@pytest.mark.parametrize("engine", ["tgi", "llamacpp"])
def test_tgi_and_llamacpp_export_no_latency_histogram(engine: str) -> None:
    state = SimState(SimSettings(engine=engine))
    state.ttft.observe(0.05)
    text = render_metrics(state)
    assert histograms(text) == {}
    assert "time_to_first_token" not in text and "_bucket" not in text


def test_stats_reset_empties_the_histograms() -> None:
    state = SimState(SimSettings())
    state.ttft.observe(0.05)
    state.e2e.observe(0.5)
    state.reset_stats()
    found = histograms(render_metrics(state))
    assert found["vllm:time_to_first_token_seconds"]["count"] == 0
    assert found["vllm:e2e_request_latency_seconds"]["buckets"]["+Inf"] == 0


# ---------------------------------------------------------------- slow_under_load, steady load


def test_steady_ttft_formula_for_the_documented_settings() -> None:
    """The numbers docs/simulator.md gives (20 user req/s of 50-token streams, 10 ms tpot,
    2 probes/s of 1 token)."""
    brief = FaultSpec(
        fault="slow_under_load", ttft=0.05, tpot=0.01, load_ttft_per_request=0.035, affects="users"
    )
    assert slow_under_load_ttft(brief, 20, 50) == pytest.approx((0.05 + 0.35) / 0.3)
    assert slow_under_load_ttft(brief, 20, 50, 2, 1) == pytest.approx(1.3473, abs=1e-3)
    target = FaultSpec(
        fault="slow_under_load", ttft=0.15, tpot=0.01, load_ttft_per_request=0.03, affects="users"
    )
    assert slow_under_load_ttft(target, 20, 50, 2, 1) == pytest.approx(1.149, abs=1e-3)
    # Probes slowed too ("all"): they hold slots longer and raise everyone's TTFT.
    everyone = FaultSpec(fault="slow_under_load", ttft=0.15, tpot=0.01, load_ttft_per_request=0.03)
    assert slow_under_load_ttft(everyone, 20, 50, 2, 1) > slow_under_load_ttft(target, 20, 50, 2)
    assert slow_under_load_ttft(target, 0, 50) == 0.15  # no load: the base TTFT


def test_steady_ttft_formula_refuses_a_load_with_no_steady_state() -> None:
    spec = FaultSpec(fault="slow_under_load", ttft=0.05, load_ttft_per_request=0.035)
    assert slow_under_load_ttft(spec, 28, 50) > 10  # k·λ = 0.98: near the edge
    with pytest.raises(ValueError, match="no steady state"):
        slow_under_load_ttft(spec, 30, 50)  # 1.05
    with pytest.raises(ValueError, match="no steady state"):
        slow_under_load_ttft(spec, 28, 50, probe_rate=1)  # probes count with "all"
    with pytest.raises(ValueError, match="negative"):
        slow_under_load_ttft(spec, -1.0, 5)
    with pytest.raises(ValueError, match="tokens"):
        slow_under_load_ttft(spec, 1.0, 0)
    with pytest.raises(ValueError, match="finite"):
        slow_under_load_ttft(spec, 1.0, 5, probe_rate=math.nan)


@pytest.mark.timed  # a rate of requests held for seconds, Little's law checked to 20 %
async def test_steady_load_follows_littles_law_and_spares_probes(
    session: aiohttp.ClientSession,
) -> None:
    """A short real run, time scaled down (about 4 s): 40 user req/s at a constant rate,
    20-token streams at 10 ms, k = 12.5 ms (k·λ = 0.5), 5 probes/s of 1 token. The
    formula's two pieces hold on what was measured after the first 1.5 s: the mean user
    TTFT is ``t0 + k·N`` with ``N = λ·W`` requests in flight (Little's law, rates and
    durations as measured, so a slow machine stretching every stream does not matter),
    and probes are never queued. On an idle machine the closed form (~0.24 s) holds too
    (measured 0.25 s)."""
    spec = FaultSpec(
        fault="slow_under_load",
        ttft=0.02,
        tpot=0.01,
        load_ttft_per_request=0.0125,
        affects="users",
    )
    assert slow_under_load_ttft(spec, 40, 20, 5, 1) == pytest.approx(0.2438, abs=1e-3)
    duration, warm_up = 3.5, 1.5
    async with running_sim(SimSettings(fault=spec)) as sim:
        results: list[tuple[float, bool, float, float]] = []

        async def one(probe: bool, sent_at: float) -> None:
            ttft, total = await timed_stream(session, sim, probe, max_tokens=1 if probe else 20)
            results.append((sent_at, probe, ttft, total))

        tasks: list[asyncio.Task[None]] = []
        start = time.monotonic()
        for index in range(int(duration * 40)):
            await asyncio.sleep(max(0.0, start + index / 40 - time.monotonic()))
            sent_at = time.monotonic() - start
            tasks.append(asyncio.create_task(one(False, sent_at)))
            if index % 8 == 0:  # 5 probes/s among the 40 users/s
                tasks.append(asyncio.create_task(one(True, sent_at)))
        window = time.monotonic() - start - warm_up
        await asyncio.gather(*tasks)
        assert sim.state.ttft.count == len(results) == 140 + 18
    users = [(ttft, total) for at, probe, ttft, total in results if not probe and at >= warm_up]
    probes = [(ttft, total) for at, probe, ttft, total in results if probe and at >= warm_up]
    in_flight = (len(users) * statistics.mean(total for _, total in users)) / window + (
        len(probes) * statistics.mean(total for _, total in probes)
    ) / window
    user_ttft = statistics.mean(ttft for ttft, _ in users)
    assert user_ttft == pytest.approx(spec.ttft + spec.load_ttft_per_request * in_flight, rel=0.2)
    assert user_ttft > 0.15  # about 17 others in flight: every user request queued
    probe_ttfts = [ttft for ttft, _ in probes]
    assert max(probe_ttfts) < min(0.1, min(ttft for ttft, _ in users)), probe_ttfts
