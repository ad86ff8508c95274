"""Where a connection's bytes stand against its request heads: what the HTTP port's
guard (``ops.http_server``) times a connection by (docs/design.md §10)."""

from __future__ import annotations

import re


class HeadScan:
    """Where a connection's bytes stand against its request heads (RFC 9112 §2.1: a
    request line, header lines, an empty line). Only the bytes are read, never parsed:
    a head ends at the first ``\r\n\r\n`` after its request line has begun, which
    aiohttp's parser (llhttp) needs too, as it answers a bare LF in a head 400.

    Empty lines before a request line begin no head (RFC 9112 §2.2: a server ignores
    them, and llhttp skips any run of CR and LF there): a client that sends only
    ``\r\n\r\n``, at once or one line at a time, or after an answered request, has
    sent no request, so it stays idle and its header timer runs on."""

    def __init__(self) -> None:
        self.owed = True  # a head is owed: the connection opened, or bytes followed a head
        self._begun = False  # the owed head's request line has begun
        self._tail = b""  # its last bytes so far (a "\r\n\r\n" split across reads)

    def feed(self, data: bytes) -> tuple[int, bool]:
        """(heads completed in ``data``, whether the head owed now began in it)."""
        completed, began = 0, False
        buffer, at = self._tail + data, 0
        while at < len(buffer):
            if not self.owed:  # any byte after a head begins the next (or is a body)
                self.owed, self._begun, began = True, False, True
            if not self._begun:
                at = _past_empty_lines(buffer, at)
                if at == len(buffer):
                    break
                self._begun = True
            end = buffer.find(b"\r\n\r\n", at)
            if end < 0:
                break
            completed, self.owed, at = completed + 1, False, end + 4
        self._tail = buffer[max(at, len(buffer) - 3) :] if self.owed and self._begun else b""
        return completed, began and self.owed


_EMPTY_LINES = re.compile(rb"[\r\n]+")


def _past_empty_lines(buffer: bytes, at: int) -> int:
    """Where the first byte other than CR and LF from ``at`` is (a scan in C: a read of
    64 KiB of empty lines costs no Python loop)."""
    match = _EMPTY_LINES.match(buffer, at)
    return match.end() if match else at
