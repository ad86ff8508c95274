"""Logging setup: one line per event, JSON or text. Secrets never reach a log call: probe
headers live only in ProbeTarget.headers, whose repr hides them."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """{"ts", "level", "logger", "msg", ...extra fields} on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """``time level logger: msg key=value ...``"""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD)
        base = (
            f"{self.formatTime(record)} {record.levelname:<5} {record.name}: {record.getMessage()}"
        )
        text = f"{base} {extras}" if extras else base
        return text + (f"\n{self.formatException(record.exc_info)}" if record.exc_info else "")


class PeerInputFilter(logging.Filter):
    """On ``aiohttp.server``: a peer's malformed HTTP request (a 4xx ``HttpProcessingError``:
    bad request line, oversized or invalid header ...) is answered 400 by aiohttp, which
    then logs "Error handling request" with a traceback at ERROR. That is the peer's
    problem, not ours: the record is downgraded to DEBUG (traceback kept there) and dropped
    unless DEBUG is enabled, so nobody can fill the log by sending garbage."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.levelno <= logging.DEBUG or not _peer_error(exc):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _peer_error(exc: BaseException | None) -> bool:
    if not isinstance(exc, HttpProcessingError):
        return False
    return 400 <= (exc.code or 400) < 500


_PEER_FILTER = PeerInputFilter()


def install_peer_input_filter() -> None:
    """Install ``PeerInputFilter`` on ``aiohttp.server`` (idempotent)."""
    logger = logging.getLogger("aiohttp.server")
    if _PEER_FILTER not in logger.filters:
        logger.addFilter(_PEER_FILTER)


_SETUP = ["text", "info"]


def current_logging() -> tuple[str, str]:
    """(format, level) of the last ``setup_logging``: what a child process sets up too."""
    return _SETUP[0], _SETUP[1]


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    _SETUP[:] = [fmt, level]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    install_peer_input_filter()
