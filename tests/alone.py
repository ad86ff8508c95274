"""Tests marked ``alone`` run with no other test beside them.

Most tests wait on real processes and run well side by side (``make test`` runs them on
several xdist workers). A few measure time against tight bounds (a hang reported within
timeout + 50 ms, a change seen within one second, a prober's schedule) or load the
machine on purpose (a starved event loop); beside other tests on a 2-core machine they
would measure the neighbours. Those carry ``@pytest.mark.alone``, and ``make test`` runs
them one at a time in a pytest run of their own (``-m alone``, no xdist, normal CPU
priority) beside the xdist pool of the others, which runs at nice 10: the timed tests get
the CPU whenever they want it, the pool the rest. Priority does not cover what starting
the pool costs (four workers importing and collecting the whole suite at once), so the
timed run waits for the pool's workers to have collected before its first test: the
pool's controller creates the file ``LLM_HEALTH_TEST_POOL_READY`` names, the timed run
waits for it (at most POOL_READY_WAIT_S).

Should they run under xdist all the same (``pytest -n 4`` by hand), the workers of the run
share a readers-writer lock (an ``flock`` file in a directory the controller makes and
hands to each worker): every test holds it shared from the start of its setup to the end
of its teardown, an ``alone`` test exclusively. :func:`alone_last` moves the ``alone``
tests to the end of the collection, where xdist hands them out last, so they wait for the
others rather than stall them. Outside xdist nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

MARKER = "alone"
POOL_READY = "LLM_HEALTH_TEST_POOL_READY"
POOL_READY_WAIT_S = 90.0


def is_alone(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARKER) is not None


def alone_last(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the ``alone`` tests last, each group in its order."""
    items[:] = [i for i in items if not is_alone(i)] + [i for i in items if is_alone(i)]


class RunLock:
    """The readers-writer lock of one xdist run (see the module doc), in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self._file = (directory / "lock").open("ab")

    @contextlib.contextmanager
    def held(self, exclusive: bool) -> Iterator[None]:
        fcntl.flock(self._file, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(self._file, fcntl.LOCK_UN)


def make_lock_directory() -> Path:
    """The controller's directory for the lock files of one run."""
    return Path(tempfile.mkdtemp(prefix="llm-health-alone-"))


def remove_lock_directory(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def pool_ready_file() -> Path | None:
    value = os.environ.get(POOL_READY, "")
    return Path(value) if value else None


def pool_collected(collected: int, workers: int) -> None:
    """On the pool's controller: ``collected`` of ``workers`` have collected the suite."""
    ready = pool_ready_file()
    if ready is not None and collected >= workers:
        ready.touch()


def wait_for_the_pool() -> None:
    """In the timed run: until the pool's workers have collected (or POOL_READY_WAIT_S)."""
    ready = pool_ready_file()
    if ready is None:
        return
    deadline = time.monotonic() + POOL_READY_WAIT_S
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
