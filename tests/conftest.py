"""Shared pytest setup."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from llm_health.sim.faults import FaultSpec
from llm_health.sim.server import SimHandle, SimSettings, running_sim
from tests import alone, envoy_harness, hangs
from tests.processes import SimProcess, running_sims

# CI runs hypothesis derandomized: the same examples every run, so a red CI is always
# reproducible (and never a lucky draw). Locally the default random search keeps exploring.
# No deadline either way: a deadline times each example by the wall clock, and `make test`
# runs these tests at a low CPU priority (tests/alone.py); tests assert behaviour.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("local", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "local")


# --- tests that run alone (tests/alone.py) -------------------------------------------------

LOCKS = pytest.StashKey[Path]()
_worker_lock: alone.RunLock | None = None


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist controller: the directory of the run's lock."""
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        config.stash[LOCKS] = alone.make_lock_directory()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: tell each worker where the run's lock is."""
    if LOCKS in node.config.stash:
        node.workerinput["alone_locks"] = str(node.config.stash[LOCKS])


def pytest_unconfigure(config: pytest.Config) -> None:
    if LOCKS in config.stash:
        alone.remove_lock_directory(config.stash[LOCKS])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    alone.check_marked_in_file(items)
    alone.alone_last(items)


@contextlib.contextmanager
def run_lock_held(item: pytest.Item) -> Iterator[None]:
    """The run's lock for ``item``: exclusive for an ``alone`` test; nothing outside xdist."""
    global _worker_lock
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None or "alone_locks" not in workerinput:
        yield
        return
    if _worker_lock is None:
        _worker_lock = alone.RunLock(Path(workerinput["alone_locks"]))
    with _worker_lock.held(exclusive=alone.is_alone(item)):
        yield


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Around the whole test (setup, call and teardown): the run's lock, taken first so
    that waiting for it is no part of the test's timeout or durations; then tell the
    Envoy harness which test runs and whether it has the ``envoy`` marker: running
    Envoy from an unmarked test fails it (see :func:`tests.envoy_harness.envoy_binary`)."""
    with run_lock_held(item):
        envoy_harness.set_current_test(item.nodeid, item.get_closest_marker("envoy") is not None)
        try:
            return (yield)
        finally:
            envoy_harness.set_current_test(None)


WATCH = pytest.StashKey[Any]()


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> None:
    """pytest-timeout arms its timer; ours prints the asyncio tasks just before it fires
    (tests/hangs.py). Returning None lets pytest-timeout arm its own."""
    timer = hangs.start_watch(item.nodeid, float(settings.timeout or 0))
    if timer is not None:
        item.stash[WATCH] = timer


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    timer = item.stash.get(WATCH, None)
    if timer is not None:
        timer.cancel()


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


@dataclass(frozen=True, slots=True)
class SimsWanted:
    """What the nearest ``@pytest.mark.sims(count, *args, prefix=..., per_module=...,
    reset=...)`` asks of the ``sims`` fixture."""

    count: int
    args: tuple[str, ...]
    prefix: str = "sim"
    per_module: bool = False  # started once for the module (else for each test)
    reset: bool = False  # per_module ones back to how they came up before each test

    @classmethod
    def of(cls, request: pytest.FixtureRequest) -> SimsWanted:
        marker = request.node.get_closest_marker("sims")
        if marker is None:
            pytest.fail("the sims fixture needs @pytest.mark.sims(count, *args)")
        count, *args = marker.args
        return cls(count, tuple(args), **marker.kwargs)


@pytest.fixture(scope="module")
def module_sims(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[SimsWanted], list[SimProcess]]]:
    """The simulators ``sims`` keeps for a whole module (``per_module=True``), started
    when first asked for, one set per different ask; all stopped after the module."""
    made: dict[SimsWanted, list[SimProcess]] = {}
    with contextlib.ExitStack() as stack:

        def get(wanted: SimsWanted) -> list[SimProcess]:
            if wanted not in made:
                workdir = tmp_path_factory.mktemp("sims")
                started = running_sims(workdir, wanted.prefix, wanted.count, *wanted.args)
                made[wanted] = stack.enter_context(started)
            return made[wanted]

        yield get


@pytest.fixture
def sims(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    module_sims: Callable[[SimsWanted], list[SimProcess]],
) -> Iterator[list[SimProcess]]:
    """``llm-health sim`` processes, each up before the test starts: as many, with the
    arguments, of the nearest ``@pytest.mark.sims(count, *args)`` (a test's, else its
    module's ``pytestmark``); ``per_module=True`` shares them between the module's tests."""
    wanted = SimsWanted.of(request)
    if not wanted.per_module:
        with running_sims(tmp_path, wanted.prefix, wanted.count, *wanted.args) as started:
            yield started
        return
    started = module_sims(wanted)
    if wanted.reset:
        for sim in started:
            sim.reset()
    yield started


@pytest.fixture
def sim_process(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SimProcess]:
    """``llm-health sim`` in a process of its own, answering before the test starts and
    stopped after it. Its arguments: those of the nearest ``@pytest.mark.sim_args(...)``."""
    marker = request.node.get_closest_marker("sim_args")
    with running_sims(tmp_path, "", 1, *(marker.args if marker else ())) as (process,):
        yield process
