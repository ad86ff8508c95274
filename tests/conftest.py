"""Shared pytest setup."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from llm_health.sim.faults import FaultSpec
from llm_health.sim.server import SimHandle, SimSettings, running_sim
from tests import envoy_harness
from tests.processes import SimProcess, running_sims

# CI runs hypothesis derandomized: the same examples every run, so a red CI is always
# reproducible (and never a lucky draw). Locally the default random search keeps exploring.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Tell the Envoy harness which test runs (setup, call and teardown) and whether it
    has the ``envoy`` marker: running Envoy from an unmarked test fails it (see
    :func:`tests.envoy_harness.envoy_binary`)."""
    envoy_harness.set_current_test(item.nodeid, item.get_closest_marker("envoy") is not None)
    try:
        return (yield)
    finally:
        envoy_harness.set_current_test(None)


# --- simulators ------------------------------------------------------------------------------


@pytest.fixture
async def sim(request: pytest.FixtureRequest) -> AsyncIterator[SimHandle]:
    """A simulator in the test's own event loop, on an ephemeral port. Its settings: the
    keywords of the nearest ``@pytest.mark.sim_settings(...)`` (a test's, else its
    module's ``pytestmark``), given to ``SimSettings``; without one, tokens come at once."""
    marker = request.node.get_closest_marker("sim_settings")
    config = (
        SimSettings(**marker.kwargs) if marker else SimSettings(fault=FaultSpec(ttft=0.0, tpot=0.0))
    )
    async with running_sim(config) as handle:
        yield handle


@pytest.fixture
def sim_process(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SimProcess]:
    """``llm-health sim`` in a process of its own, answering before the test starts and
    stopped after it. Its arguments: those of the nearest ``@pytest.mark.sim_args(...)``."""
    marker = request.node.get_closest_marker("sim_args")
    with running_sims(tmp_path, "", 1, *(marker.args if marker else ())) as (process,):
        yield process
