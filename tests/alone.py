"""Tests marked ``alone`` run with no other test beside them; tests marked ``timed`` run
one at a time, first in line for the CPU.

Most tests wait on real processes and run well side by side (``make test`` runs them on
several xdist workers). Some measure time against tight bounds (a hang reported within
timeout + 50 ms, a change seen within one second, a prober's schedule): beside other
tests on a 2-core machine they would measure the neighbours. Those carry
``@pytest.mark.timed``, and ``make test`` runs them one at a time in a pytest run of their
own while the xdist run goes on beside them at a low CPU priority
(``tests/background.sh``): whenever a timed test wants a core it gets one, and the
neighbours take what it leaves. A timed test takes one core at most (it mostly waits, or
its load is one process): the other core stays the neighbours'. A few load both cores on
purpose (floods of connections or DNS answers from processes of their own, a 4 MiB
document parsed in one process while another serves it): beside them even a low-priority
neighbour would starve, and a starved neighbour's own bounds fail. Those carry
``@pytest.mark.alone`` and run last, one at a time, with nothing beside them
(``-m alone``).

Should they run under xdist all the same (``pytest -n 4`` by hand), the workers of the run
share a readers-writer lock (an ``flock`` file in a directory the controller makes and
hands to each worker): every test holds it shared from the start of its setup to the end
of its teardown, an ``alone`` or ``timed`` test exclusively. :func:`alone_last` moves
those tests to the end of the collection, where xdist hands them out last, so they wait
for the others rather than stall them. Outside xdist nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

MARKERS = ("alone", "timed")


def _marker(item: pytest.Item) -> str | None:
    return next((m for m in MARKERS if item.get_closest_marker(m) is not None), None)


def is_alone(item: pytest.Item) -> bool:
    """Whether ``item`` runs with nothing beside it under xdist: ``alone`` or ``timed``."""
    return _marker(item) is not None


def check_marked_in_file(items: list[pytest.Item]) -> None:
    """``make test`` runs the alone (timed) tests from the files whose text says
    ``mark.alone`` (``mark.timed``; Makefile: ALONE_FILES, TIMED_FILES); a test marked any
    other way would run in none of its runs."""
    texts: dict[Path, str] = {}
    for item in items:
        marker = _marker(item)
        if marker is None:
            continue
        path = Path(str(item.path))
        if path not in texts:
            texts[path] = path.read_text(encoding="utf-8")
        if f"mark.{marker}" not in texts[path]:
            raise pytest.UsageError(f"{item.nodeid}: mark it with pytest.mark.{marker} in its file")


def alone_last(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the ``alone`` and ``timed`` tests last, each group in its
    order."""
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
