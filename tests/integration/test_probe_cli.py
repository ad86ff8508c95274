"""`llm-health probe URL` against the simulator: output, exit codes, no secrets printed."""

from __future__ import annotations

import asyncio
import time

import pytest

from llm_health.cli import main
from llm_health.sim.faults import FaultSpec
from llm_health.sim.server import SimSettings, running_sim


async def run_cli(*args: str) -> int:
    # main() runs its own event loop: run it in a thread so the simulator keeps serving.
    return await asyncio.to_thread(main, list(args))


async def test_healthy_endpoint_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    async with running_sim(SimSettings(api_key="sk-secret-777")) as sim:
        code = await run_cli(
            "probe",
            sim.base_url,
            "--count",
            "2",
            "--interval",
            "10ms",
            "--header",
            "Authorization: Bearer sk-secret-777",
        )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "probe 1: FAST" in out and "probe 2: FAST" in out
    assert "model sim-model" in out  # discovered from /v1/models
    assert "2 probes: 2 fast; ttft p50" in out
    assert "sk-secret-777" not in out


async def test_zombie_exits_one_with_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    settings = SimSettings(fault=FaultSpec(fault="hang_after_headers"))
    async with running_sim(settings) as sim:
        code = await run_cli("probe", sim.base_url, "--count", "1", "--timeout", "300ms")
    out = capsys.readouterr().out
    assert code == 1
    assert "TIMEOUT" in out and "no first token within 300 ms" in out


async def test_chat_api_and_full_path(capsys: pytest.CaptureFixture[str]) -> None:
    async with running_sim() as sim:
        url = f"{sim.base_url}/v1/chat/completions"
        code = await run_cli("probe", url, "--api", "openai-chat", "--count", "1")
    assert code == 0
    assert "/v1/chat/completions" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["probe", "ftp://x"],
        ["probe", "http://127.0.0.1:1", "--count", "0"],
        ["probe", "http://127.0.0.1:1", "--timeout", "80x"],
        ["probe", "http://127.0.0.1:1", "--header", "nocolon"],
    ],
)
def test_bad_arguments_exit_two(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


async def test_the_cache_bypass_follows_the_detected_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As in ``serve``: llama.cpp ignores ``cache_salt``; its bypass is ``cache_prompt``."""
    async with running_sim(SimSettings(engine="llamacpp")) as sim:
        code = await run_cli("probe", sim.base_url, "--count", "1")
        request = sim.state.last_request
    out = capsys.readouterr().out
    assert code == 0, out
    assert "engine llamacpp, cache bypass cache_prompt" in out
    assert request is not None
    assert request.get("cache_prompt") is False and request.get("cache_salt") is None


async def test_a_cache_bypass_given_is_the_one_sent(capsys: pytest.CaptureFixture[str]) -> None:
    async with running_sim(SimSettings(engine="llamacpp")) as sim:
        code = await run_cli("probe", sim.base_url, "--count", "1", "--cache-bust", "salt")
        request = sim.state.last_request
    assert code == 0
    assert "engine unknown, cache bypass salt" in capsys.readouterr().out
    assert request is not None and request.get("cache_salt") and request.get("cache_prompt") is None


# A wedged backend (the sim's ``info`` knob "hang": /v1/models and every info endpoint
# answer nothing) hung at each point of the probe's own request. The bound is the
# command's promise (docs/operations.md): timeout + 1 s per probe, engine detection on.
HANG_POINTS = [
    ("hang_before_headers", 1),
    ("hang_after_headers", 1),
    ("hang_after_role_chunk", 1),
    ("hang_after_first_token", 0),  # the token came: FAST, however the body ends
]
TIMEOUT_S = 0.3
PER_PROBE_S = TIMEOUT_S + 1.0


async def timed_cli(*args: str) -> tuple[int, float]:
    started = time.monotonic()
    code = await run_cli(*args)
    return code, time.monotonic() - started


def wedged(fault: str) -> SimSettings:
    return SimSettings(fault=FaultSpec(fault=fault, info="hang", hang_max=30.0))


@pytest.mark.timed  # the command's wall time against its promise
@pytest.mark.parametrize(("fault", "exit_code"), HANG_POINTS)
async def test_a_wedged_backend_gets_its_verdict_within_the_timeout(
    fault: str, exit_code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_sim(wedged(fault)) as sim:
        code, took = await timed_cli(
            *("probe", sim.base_url, "--api", "openai-chat", "--model", "sim-model"),
            *("--count", "1", "--timeout", f"{TIMEOUT_S * 1000:g}ms"),
        )
    out = capsys.readouterr().out
    assert took < PER_PROBE_S, out
    assert code == exit_code, out
    assert "engine detection gave up after 0.5 s" in out
    assert "probing with the default body" in out and "engine unknown" in out
    assert "model discovery" not in out  # --model given: not asked


@pytest.mark.timed  # as above
async def test_count_probes_each_within_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    async with running_sim(wedged("hang_after_headers")) as sim:
        code, took = await timed_cli(
            *("probe", sim.base_url, "--count", "3", "--interval", "10ms"),
            *("--timeout", f"{TIMEOUT_S * 1000:g}ms"),
        )
    out = capsys.readouterr().out
    assert took < 3 * PER_PROBE_S, out
    assert code == 1
    assert "3 probes: 3 timeout" in out
    assert "model discovery gave up after 0.5 s" in out and "probing without a model" in out
    assert "engine detection gave up after 0.5 s" in out


@pytest.mark.timed  # as above
async def test_a_detection_in_time_is_used_and_not_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = SimSettings(engine="llamacpp", fault=FaultSpec(fault="hang_after_headers"))
    async with running_sim(settings) as sim:
        code, took = await timed_cli("probe", sim.base_url, "--count", "1", "--timeout", "300ms")
    out = capsys.readouterr().out
    assert took < PER_PROBE_S, out
    assert code == 1
    assert "engine llamacpp, cache bypass cache_prompt" in out
    assert "gave up" not in out
