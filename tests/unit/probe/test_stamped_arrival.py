"""When bytes arrived, on the prober's clock (probe/http1/stamped.py ``arrival``): the
kernel's receive stamp of a real loopback packet, moved from the wall clock onto
``time.perf_counter``'s. A prober paused between reading the two clocks (a busy machine)
must never date the bytes earlier than they came: earlier than the request, they are
"an answer before the request was sent" (ERROR); earlier than the token, a TTFT too short
(a false FAST)."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from llm_health.probe.http1 import stamped

pytestmark = pytest.mark.skipif(not stamped.STAMPS, reason="no kernel stamps here")

SO_TIMESTAMPNS = stamped.SO_TIMESTAMPNS or 0  # known wherever STAMPS (skipped otherwise)
PAUSE_S = 0.05  # a prober preempted between two clock reads


def stamped_packet() -> tuple[list[tuple[int, int, bytes]], float, float]:
    """A packet's ancillary data as the kernel hands it over, with ``perf_counter`` read
    just before the packet was sent and just after it was read."""
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as client,
    ):
        peer, _ = server.accept()
        with peer:
            peer.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            sent = time.perf_counter()
            client.sendall(b"data: token\n\n")
            _data, ancillary, _flags, _address = peer.recvmsg(64, socket.CMSG_SPACE(16))
            read = time.perf_counter()
    return ancillary, sent, read


def paused(clock: Callable[[], float], pauses: list[float]) -> Callable[[], float]:
    """``clock`` as read by a prober that is paused PAUSE_S before each of its reads."""

    def read() -> float:
        pauses.append(PAUSE_S)
        return clock() + sum(pauses)

    return read


def test_the_kernel_stamp_lies_between_the_send_and_the_read() -> None:
    ancillary, sent, read = stamped_packet()
    assert [(level, kind) for level, kind, _raw in ancillary] == [
        (socket.SOL_SOCKET, SO_TIMESTAMPNS)
    ]
    assert sent <= stamped.arrival(ancillary) <= time.perf_counter()
    assert stamped.arrival(ancillary) <= read + 0.5  # the wall clock did not jump meanwhile


def test_a_pause_between_the_clock_reads_never_dates_the_bytes_earlier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ancillary, sent, _read = stamped_packet()
    pauses: list[float] = []
    clocks = SimpleNamespace(
        time=paused(time.time, pauses), perf_counter=paused(time.perf_counter, pauses)
    )
    monkeypatch.setattr(stamped, "time", clocks)
    arrived = stamped.arrival(ancillary)
    monkeypatch.undo()
    assert len(pauses) == 2  # both clocks read once, each after a pause
    # Every clock read here is PAUSE_S late, and the second one 2 x PAUSE_S: read in the
    # other order, the arrival came PAUSE_S before the packet was even sent.
    assert arrived >= sent
    assert arrived <= time.perf_counter() + 2 * PAUSE_S


def test_no_stamp_is_the_time_of_the_read() -> None:
    before = time.perf_counter()
    assert before <= stamped.arrival([]) <= time.perf_counter()
    future = struct.pack("@qq", int(time.time()) + 3600, 0)  # the wall clock stepped back
    before = time.perf_counter()
    assert before <= stamped.arrival([(socket.SOL_SOCKET, SO_TIMESTAMPNS, future)])
