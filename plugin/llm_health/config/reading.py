"""Reading a configuration file: only a regular file, and never past the size limit.

A FIFO's open would wait for a writer, forever, and a device's data never ends: those (and
directories, sockets) are refused before any read (docs/design.md §7.11). Used by the
loader, and by the reload watcher (``fingerprint``).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

from llm_health.errors import ConfigError

MAX_FILE_BYTES = 4 * 1024 * 1024  # 4 MiB


def read_text(file: Path) -> str:
    """The file's text; its size is checked before it is read, and the read is bounded
    (a file that grows meanwhile is still never read past the limit)."""
    try:
        with open_regular(file) as handle:
            size = os.fstat(handle.fileno()).st_size
            data = b"" if size > MAX_FILE_BYTES else handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"{file}: cannot read: {exc}"]) from None
    if size > MAX_FILE_BYTES or len(data) > MAX_FILE_BYTES:
        raise ConfigError([f"{file}: {too_big(max(size, len(data)))}"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{file}: cannot read: not UTF-8 text (byte {exc.start})"]) from None


def open_regular(file: Path) -> BinaryIO:
    """``file`` opened for reading, if it is a regular file; ConfigError if it is not
    (OSError if it cannot be opened). A FIFO's open would wait for a writer, forever, and
    a device's data never ends: the path is checked before the open (opening a device may
    act on it), and the open descriptor again (the path may be replaced in between), with
    O_NONBLOCK so that not even a FIFO swapped in meanwhile can hold the open."""
    _refuse_irregular(file, os.stat(file).st_mode)
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _refuse_irregular(file, os.fstat(fd).st_mode)
    except ConfigError:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _refuse_irregular(file: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _NOT_REGULAR if test(mode)), "an unknown kind of file")
    raise ConfigError([f"{file}: cannot read: it is {kind}, not a regular file"])


def too_big(size: int) -> str:
    return f"the file is larger than the limit of {MAX_FILE_BYTES} bytes (4 MiB): {size} bytes"


def fingerprint(path: Path | None) -> bytes | None:
    """The config file's content hash (None if absent/unreadable, or not a regular file:
    a FIFO's open would hold this worker thread forever): a touch without a change does
    not reload; an editor's atomic rename does."""
    if path is None:
        return None
    try:
        with open_regular(path) as handle:
            # Bounded: a file over the loader's limit is hashed on its first bytes and its
            # size (the reload that follows is rejected by the loader anyway).
            head = handle.read(MAX_FILE_BYTES + 1)
            size = os.fstat(handle.fileno()).st_size
    except (OSError, ConfigError):
        return None
    return hashlib.sha256(head + size.to_bytes(8, "big")).digest()
