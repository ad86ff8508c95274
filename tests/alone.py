"""Tests marked ``alone`` run with no other test beside them, also under pytest-xdist.

Most tests wait on real processes and run well side by side (``make test`` runs them on
several xdist workers). A few measure time against tight bounds (a hang reported within
timeout + 50 ms, a change seen within one second, a prober's schedule) or load the
machine on purpose (a starved event loop); beside other tests on a 2-core machine they
would measure the neighbours. Those carry ``@pytest.mark.alone``.

The workers of one run share a readers-writer lock (two ``flock`` files in a directory
the controller makes for the run and hands to each worker): every test holds it shared
from the start of its setup to the end of its teardown; an ``alone`` test holds it
exclusively. Writers go first: while an ``alone`` test waits, no other test starts (a
turnstile file every test passes through), so it waits only for the tests already
running. :func:`alone_last` moves the ``alone`` tests to the end of the run, so the
workers drain once, not once per test. Outside xdist tests run one at a time anyway and
nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

MARKER = "alone"


def is_alone(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARKER) is not None


def alone_last(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the ``alone`` tests last, each group in its order."""
    items[:] = [i for i in items if not is_alone(i)] + [i for i in items if is_alone(i)]


class RunLock:
    """The readers-writer lock of one xdist run (see the module doc), in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self._turnstile = (directory / "turnstile").open("ab")
        self._room = (directory / "room").open("ab")

    @contextlib.contextmanager
    def held(self, exclusive: bool) -> Iterator[None]:
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:  # a writer keeps the turnstile: no new reader meanwhile
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)


def make_lock_directory() -> Path:
    """The controller's directory for the lock files of one run."""
    return Path(tempfile.mkdtemp(prefix="llm-health-alone-"))


def remove_lock_directory(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
