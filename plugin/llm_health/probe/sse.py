"""Incremental Server-Sent Events decoding with hard bounds (pure, no I/O).

Only what engines emit matters: ``data:`` lines, events ended by a blank line, ``:``
comment lines (keep-alives) skipped. ``simple_event`` reads the common shape (an event of
one ``data:`` line) without a decoder, as the decoder would. A line longer than ``max_line`` bytes raises
ProtocolError: a garbage or hostile stream cannot make the prober buffer without end.
"""

from __future__ import annotations

from llm_health.errors import ProtocolError

MAX_LINE_BYTES = 64 * 1024


class SseDecoder:
    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._max_line = max_line
        self._pending = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """Consume bytes; return the payloads of every event completed by them."""
        if b"\n" not in chunk:  # no line ends here: nothing to split
            self._pending += chunk
            self._check_pending()
            return []
        # One split for the whole chunk (the lines a probe's answer brings come together),
        # not a find and a copy of the rest per line.
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        events: list[str] = []
        for line in lines:
            event = self._line(line.rstrip(b"\r"))
            if event is not None:
                events.append(event)
        self._check_pending()
        return events

    def _check_pending(self) -> None:
        if len(self._pending) > self._max_line:
            raise ProtocolError(f"stream line longer than {self._max_line} bytes")

    @property
    def idle(self) -> bool:
        """Nothing held: no line begun, no event begun (what comes next starts afresh)."""
        return not self._pending and not self._data

    def close(self) -> str | None:
        """End of stream: an event still open (no trailing blank line) is delivered."""
        return self._flush()

    def _line(self, line: bytes) -> str | None:
        if not line:
            return self._flush()
        if line.startswith(b":"):
            return None  # SSE comment, used as keep-alive
        field, _, value = line.partition(b":")
        if field == b"data":
            self._data.append(value.removeprefix(b" ").decode("utf-8", "replace"))
        return None

    def _flush(self) -> str | None:
        if not self._data:
            return None
        payload, self._data = "\n".join(self._data), []
        return payload


def simple_event(chunk: bytes, start: int) -> tuple[str, int] | None:
    """The event at ``start`` of ``chunk`` when it is the common shape, one ``data:`` line
    and a blank line (``\n`` or ``\r\n`` ends), and where it ends; None for anything
    else (another field, a comment, several lines, a part of an event), which only an
    ``SseDecoder`` reads. What it gives is what the decoder would: the payload of that
    event, decoded alike, and nothing of the rest."""
    if not chunk.startswith(b"data:", start):
        return None
    end = chunk.find(b"\n", start)
    if end < 0:
        return None
    after = end + 1
    if chunk.startswith(b"\n", after):
        after += 1
    elif chunk.startswith(b"\r\n", after):
        after += 2
    else:
        return None
    value = chunk[start + 5 : end].rstrip(b"\r")
    if value.startswith(b" "):
        value = value[1:]
    return value.decode("utf-8", "replace"), after
