"""Tests marked ``alone`` run with no other test beside them.

Most tests wait on real processes and run well side by side (``make test`` runs them on
several xdist workers). A few measure time against tight bounds (a hang reported within
timeout + 50 ms, a change seen within one second, a prober's schedule) or load the
machine on purpose (a starved event loop); beside other tests on a 2-core machine they
would measure the neighbours. Those carry ``@pytest.mark.alone``, and ``make test`` runs
them after the others, in a second pytest run without xdist (``-m alone``).

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
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

MARKER = "alone"


def is_alone(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARKER) is not None


def check_marked_in_file(items: list[pytest.Item]) -> None:
    """``make test`` runs the alone tests from the files whose text says ``mark.alone``
    (Makefile: ALONE_FILES); an alone test marked any other way would run in neither run."""
    texts: dict[Path, bool] = {}
    for item in items:
        if not is_alone(item):
            continue
        path = Path(str(item.path))
        if path not in texts:
            texts[path] = "mark.alone" in path.read_text(encoding="utf-8")
        if not texts[path]:
            raise pytest.UsageError(f"{item.nodeid}: mark it with pytest.mark.alone in its file")


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
