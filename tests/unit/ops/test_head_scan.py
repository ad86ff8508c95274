"""``HeadScan``: where a connection's bytes stand against its request heads, for the HTTP
port's guard (ops/http_server.py). Known cases, then an oracle: a byte-at-a-time reading
of the same rule, against the scan fed the same bytes split anywhere."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llm_health.ops.head_scan import HeadScan

HEAD = b"GET /livez HTTP/1.1\r\nHost: pod\r\n\r\n"


def fed(*chunks: bytes) -> tuple[HeadScan, list[tuple[int, bool]]]:
    scan = HeadScan()
    return scan, [scan.feed(chunk) for chunk in chunks]


def test_empty_lines_alone_are_no_head_however_they_arrive() -> None:
    for chunks in ([b"\r\n\r\n"], [b"\r\n"] * 50, [b"\r", b"\n", b"\r\n\r", b"\n"], [b"\n\n"]):
        scan, results = fed(*chunks)
        assert all(completed == 0 for completed, _ in results), chunks
        assert scan.owed  # still owes its first head: the header timer runs on


def test_a_head_after_empty_lines_ends_at_its_own_empty_line() -> None:
    scan, results = fed(b"\r\n\r\n" + HEAD)
    assert results == [(1, False)] and not scan.owed
    scan, results = fed(b"\r\n\r\n", b"GET /livez HTTP/1.1\r\n", b"Host: pod\r\n\r", b"\n")
    assert [c for c, _ in results] == [0, 0, 0, 1] and not scan.owed


def test_empty_lines_after_an_answered_request_begin_a_head_that_never_ends() -> None:
    scan, results = fed(HEAD, b"\r\n", b"\r\n")
    assert results == [(1, False), (0, True), (0, False)]
    assert scan.owed  # the timer, armed by the first of them, runs on


def test_pipelined_heads_in_one_read_are_each_counted() -> None:
    scan, results = fed(HEAD + HEAD + b"GET /rea")
    assert results == [(2, True)] and scan.owed  # the third began: timer armed
    assert fed(HEAD * 3)[1] == [(3, False)]


def test_a_split_end_of_head_is_found() -> None:
    scan, results = fed(b"GET / HTTP/1.1\r\nHost: x\r", b"\n\r", b"\n")
    assert [c for c, _ in results] == [0, 0, 1] and not scan.owed


def test_a_run_of_empty_lines_is_not_read_byte_by_byte_into_a_head() -> None:
    # The request line begins after the run: "\r\n\r\n" inside the run ends nothing.
    scan, results = fed(b"\r\n" * 30_000 + b"GET / HTTP/1.1\r\n")
    assert results == [(0, False)] and scan.owed


def oracle(chunks: list[bytes]) -> list[tuple[int, bool, bool]]:
    """The rule, one byte at a time: any byte after a complete head begins the next;
    CR and LF before a request line are skipped; from the request line on, a head ends at
    "\\r\\n\\r\\n". Per chunk: (heads completed, a head owed that began in it, owed)."""
    owed, begun, window = True, False, b""
    out = []
    for chunk in chunks:
        completed, began = 0, False
        for byte in chunk:
            if not owed:
                owed, begun, window, began = True, False, b"", True
            if not begun and byte in b"\r\n":
                continue
            begun, window = True, (window + bytes([byte]))[-4:]
            if window == b"\r\n\r\n":
                completed, owed = completed + 1, False
        out.append((completed, began and owed, owed))
    return out


PIECES = st.sampled_from(
    [b"\r", b"\n", b"\r\n", b"\r\n\r\n", b"G", b"GET / HTTP/1.1", b"x: y", HEAD]
)


@given(st.lists(st.lists(PIECES, max_size=8).map(b"".join), max_size=12))
def test_the_scan_agrees_with_the_byte_at_a_time_rule(chunks: list[bytes]) -> None:
    scan, got = HeadScan(), []
    for chunk in chunks:
        completed, began = scan.feed(chunk)
        got.append((completed, began, scan.owed))
    assert got == oracle(chunks)
