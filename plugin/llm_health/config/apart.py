"""A reload's file read and validated off the event loop (docs/design.md §6.4): on a
thread when it is small, in a process of its own when it is large.

Reading a file at the loader's limits (4 MiB, 500,000 values) is seconds of Python. On a
thread of the service it shares the interpreter lock with the event loop that answers
``/livez`` and times the probes, and every turn of that loop then waits for the lock; on a
loaded 2-core machine one answer took 157 ms. In a child process, at a lower CPU priority,
the loop only waits for a pipe, and what the read allocated is freed with the child.
Starting that interpreter costs about a second of CPU, so a file of at most
APART_FROM_BYTES (tens of milliseconds to read) is still read on a thread.

The child runs this module's ``main`` (niced first): it loads the file with the same
``load_config`` as ``serve`` and ``validate`` (``${ENV}`` from the environment it
inherits) and writes one pickled answer, ``("config", Config)`` or
``("problems", [message, ...])``, to its stdout. Only our own child writes that pipe; its
answer is still bounded in size and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from llm_health.config.loader import load_config
from llm_health.config.schema import Config
from llm_health.errors import ConfigError

APART_FROM_BYTES = 256 * 1024  # larger files are read in a child process
LOAD_TIMEOUT_S = 60.0  # a file at the limits validates in 3-5 s on 2 cores
ANSWER_LIMIT = 64 * 1024 * 1024  # a config at every limit pickles to far less
CHILD_NICENESS = 10  # a reload yields the CPU to the probes and the answers
KILL_WAIT_S = 2.0  # SIGKILL ends the child at once
# The child lowers its priority before anything else: its imports are most of its CPU.
_CHILD = (
    f"import os; os.nice({CHILD_NICENESS}); import sys; "
    f"from {__name__} import main; sys.exit(main(sys.argv[1:]))"
)


async def load_config_off_loop(path: str | Path) -> Config:
    """``load_config(path)`` without holding the event loop: on a thread for a small file
    (or one that is not a regular file: the loader refuses it at once), else in a child."""
    try:
        size = (await asyncio.to_thread(os.stat, path)).st_size
    except OSError:
        size = 0  # the loader says why it cannot read it
    if size <= APART_FROM_BYTES:
        return await asyncio.to_thread(load_config, path)
    return await load_config_apart(path)


async def load_config_apart(path: str | Path, within_s: float = LOAD_TIMEOUT_S) -> Config:
    """``load_config(path)`` in a child process. Raises ConfigError with the file's
    problems, or with one line saying why the child gave no answer."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        str(path),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(within_s):
            answer = await _read_answer(child)
            code = await child.wait()
    except TimeoutError:
        raise ConfigError([f"cannot load the config: no answer within {within_s:g} s"]) from None
    finally:
        await _stop(child)
    return _decode(answer, code)


async def _read_answer(child: asyncio.subprocess.Process) -> bytes:
    assert child.stdout is not None
    parts: list[bytes] = []
    size = 0
    while chunk := await child.stdout.read(1 << 20):
        size += len(chunk)
        if size > ANSWER_LIMIT:
            raise ConfigError(["cannot load the config: the reading process said too much"])
        parts.append(chunk)
    return b"".join(parts)


async def _stop(child: asyncio.subprocess.Process) -> None:
    """Kill a child still running (a timeout, a cancelled reload at shutdown) and collect
    its exit: SIGKILL ends it at once."""
    if child.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(KILL_WAIT_S):
            await child.wait()


def _decode(answer: bytes, code: int) -> Config:
    try:
        kind, value = pickle.loads(answer)  # our own child's answer
    except Exception:
        raise ConfigError(
            [f"cannot load the config: the reading process exited ({code})"]
        ) from None
    if kind == "config" and isinstance(value, Config):
        return value
    if kind == "problems" and isinstance(value, list):
        raise ConfigError([str(message) for message in value])
    raise ConfigError(["cannot load the config: the reading process gave no answer"])


def _answer(path: str) -> tuple[str, Any]:
    try:
        return "config", load_config(path)
    except ConfigError as exc:
        return "problems", list(exc.messages)
    except Exception as exc:  # a loader bug is a rejected reload, never a crash
        return "problems", [f"cannot load the config: {type(exc).__name__}"]


def main(argv: list[str]) -> int:
    sys.stdout.buffer.write(pickle.dumps(_answer(argv[0]), protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()
    return 0
