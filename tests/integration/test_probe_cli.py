"""`llm-health probe URL` against the simulator: output, exit codes, no secrets printed."""

from __future__ import annotations

import asyncio

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
