"""The test suite's port picking (tests/ports.py): two runs side by side and the xdist
workers of a run never share a port range."""

from __future__ import annotations

import pytest

from tests.ports import RANGE, run_range, worker_slice


def test_a_run_takes_its_range_from_the_variable() -> None:
    assert run_range("") == RANGE
    assert run_range("30000-32000") == (30000, 32000)
    for bad in ("19000-21000", "30000-30000", "31000-30000", "30000-40000"):
        with pytest.raises(ValueError, match="not a range within"):
            run_range(bad)


def test_workers_split_their_runs_range_without_overlap() -> None:
    pool = [worker_slice(f"gw{n}", "4", (20000, 30000)) for n in range(4)]
    assert pool == [(20000, 22500), (22500, 25000), (25000, 27500), (27500, 30000)]
    assert worker_slice("", "", (30000, 32000)) == (30000, 32000)  # outside xdist
