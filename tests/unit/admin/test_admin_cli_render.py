"""`llm-health status` rendering: the table fits the terminal, change lines say what moved."""

from __future__ import annotations

import pytest

from llm_health.cli.admin import change_line, render_table, status_json
from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State
from llm_health.ops.status_document import status_document

LONG_CLUSTER = "meta-llama-3.1-405b-instruct-fp8-east-1"
LONG_ADDRESS = "[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:8000"


def board() -> Board:
    endpoints = (
        EndpointSpec("10.0.0.1:8000", "10.0.0.1", 8000, 100),
        EndpointSpec(LONG_ADDRESS, LONG_ADDRESS[1:-6], 8000, 100),
    )
    result = Board([ClusterSpec(LONG_CLUSTER, Policy(healthy_after=1), endpoints)], 0.0, 1e9)
    result.record(LONG_CLUSTER, "10.0.0.1:8000", ProbeResult(Outcome.FAST, 1e9, ttft_ms=41.3), 1.0)
    result.record(
        LONG_CLUSTER,
        LONG_ADDRESS,
        ProbeResult(Outcome.FATAL, 1e9, detail="CUDA error: an illegal memory access " * 5),
        1.0,
    )
    return result


@pytest.mark.parametrize("width", [80, 100, 160])
def test_table_fits_the_width(width: int) -> None:
    text = render_table(board().snapshot(), width, now=1e9 + 65)
    lines = text.splitlines()
    assert len(lines) == 4  # summary, header, two endpoints
    assert all(len(line) <= width for line in lines), [len(line) for line in lines]
    assert (
        lines[0].startswith("revision ") and "1 healthy" in lines[0] and "1 unhealthy" in lines[0]
    )
    assert lines[1].split()[:3] == ["CLUSTER", "ENDPOINT", "STATE"]
    assert "healthy" in lines[2] and "41.3ms" in lines[2] and "64s" in lines[2]
    assert "unhealthy" in lines[3] and "fatal" in lines[3]


def test_override_is_marked() -> None:
    b = board()
    b.set_override(LONG_CLUSTER, "10.0.0.1:8000", State.DRAINING, until=100.0, reason="m")
    row = render_table(b.snapshot(), 100).splitlines()[2]
    assert "draining*" in row


def test_status_json_is_the_status_document_minus_time() -> None:
    snapshot = board().snapshot()
    doc = status_document(snapshot)
    assert status_json(snapshot) == {"revision": doc["revision"], "clusters": doc["clusters"]}


def test_change_line() -> None:
    b = board()
    before = b.snapshot().clusters[LONG_CLUSTER].endpoints[0]
    b.drain(LONG_CLUSTER, "10.0.0.1:8000", 2.0, "kernel upgrade")
    after = b.snapshot().clusters[LONG_CLUSTER].endpoints[0]
    line = change_line(before, after, 1e9)
    assert "10.0.0.1:8000  healthy -> draining  envoy draining/100  kernel upgrade" in line
    assert "added draining" in change_line(None, after, 1e9)
    assert "draining (unchanged)" in change_line(after, after, 1e9)
