"""The integrity guard under a starved prober (docs/design.md §7, §16): while the
plugin's own event loop is blocked again and again (a CPU-starved or GC-paused process),
no measurement taken across a block may become a verdict. Three healthy simulator
endpoints in their own processes; this test burns the plugin's loop in long blocking
sleeps (longer than the probe timeout, longer than the silence point) for a few seconds:
no endpoint may change state, and the probes across the blocks must have seen them: the
guard counted what it ignored, or a result carries the block as its lag (a token that
arrived inside a block is read in the turn that ends it, its TTFT less the stall:
``verdict.result_of``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from llm_health.model.states import State
from tests.configs import plugin_yaml
from tests.polling import wait_until_async
from tests.processes import SimProcess
from tests.runtime import Running

PROBE = {"interval": "200ms", "timeout": "500ms", "healthy_ttft": "150ms", "model": "sim-model"}
# timed: it starves its own event loop on purpose; a loaded machine would add to it.
pytestmark = [pytest.mark.timed, pytest.mark.sims(3, "--ttft", "30ms", prefix="starved-")]
BLOCK_S = 0.7  # longer than the timeout: probes in flight then read TIMEOUT
BLOCKS = 8


async def _burn(blocks: int, block_s: float) -> None:
    """Block the loop ``blocks`` times, letting it run ~150 ms in between (so probes
    start, then have their first token land inside the next block)."""
    for _ in range(blocks):
        time.sleep(block_s)  # noqa: ASYNC251 (deliberately blocking: the starved prober)
        await asyncio.sleep(0.15)


async def test_a_starved_loop_gives_no_verdict(sims: list[SimProcess]) -> None:
    async with Running.from_config(plugin_yaml(sims, probe=PROBE), "starved.yaml") as running:
        runtime = running.runtime
        changes: list[tuple[str, str]] = []
        runtime.control.on_transition(
            lambda _c, address, t, _r: (
                changes.append((address, t.after.state.value)) if t.changed else None
            )
        )

        def all_healthy() -> bool:
            cluster = runtime.control.snapshot().clusters["llama"]
            return all(e.state is State.HEALTHY for e in cluster.endpoints)

        await wait_until_async(all_healthy, 15, "three healthy endpoints")
        await asyncio.sleep(0.5)
        changes.clear()
        lags: list[float] = []
        runtime.control.on_probe(lambda _c, _a, result: lags.append(result.loop_lag_ms))
        ignored_before = runtime.stats.probes_ignored_loop_lag
        silences_before = runtime.stats.silences_ignored_loop_lag
        await _burn(BLOCKS, BLOCK_S)
        await asyncio.sleep(1.0)  # the probes in flight at the last block come back
        ignored = runtime.stats.probes_ignored_loop_lag - ignored_before
        silences = runtime.stats.silences_ignored_loop_lag - silences_before
    assert changes == [], f"a starved prober changed states: {changes}"
    across = sum(1 for lag in lags if lag >= BLOCK_S * 1000 / 2)
    assert ignored + silences + across > 0, "the blocks were never noticed: nothing measured"
    cluster = runtime.control.snapshot().clusters["llama"]
    assert all(e.state is State.HEALTHY for e in cluster.endpoints)
