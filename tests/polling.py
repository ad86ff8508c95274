"""The one way tests wait for something: poll a predicate until it holds.

:func:`wait_until` blocks the thread; :func:`wait_until_async` sleeps with
``asyncio.sleep`` so the event loop keeps serving (an in-process server, a sim) and also
accepts an async predicate. Both have the same semantics:

- ``predicate()`` is called at once, then every ``interval`` seconds; its first truthy
  value is returned.
- An exception of a type in ``ignore`` (default: any ``Exception``) counts as "not yet":
  a process that is still starting refuses connections, a half-written file does not
  parse, a key is not there yet. Types in ``fatal`` propagate at once even if ``ignore``
  covers them (e.g. "the process died": waiting longer cannot help).
- After ``timeout`` seconds (the predicate is tried once more at the deadline) it raises
  :class:`WaitTimeout`, an ``AssertionError``, naming ``what`` and the last value and
  last exception seen; the last exception is chained. ``what`` may be a function: it is
  asked then, to say what the processes say at that moment.

:func:`seconds_until` is :func:`wait_until` returning the seconds the wait took, for a
test whose bound is on that time.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")
Errors = tuple[type[BaseException], ...]
What = str | Callable[[], str]  # what is awaited, or a function saying it at the timeout

INTERVAL_S = 0.05  # between two calls of the predicate (sync)
ASYNC_INTERVAL_S = 0.02  # async: usually in-process state, cheap to look at


class WaitTimeout(AssertionError):
    """The awaited condition did not hold within the timeout."""


_NOTHING: Any = object()


class _Last:
    """What the predicate did last: its value and the last exception it raised.

    The exception's traceback holds the polling loop's frame, and that frame holds this
    object: a cycle. Dropping the exception on success breaks it, so that e.g. an HTTP
    error's socket is closed at once, not by the cyclic GC at some random later point (a
    ResourceWarning, an error under ``filterwarnings = error``, in an unrelated place).
    """

    def __init__(self) -> None:
        self.value: Any = _NOTHING
        self.error: BaseException | None = None

    def timeout(self, what: What, timeout: float) -> WaitTimeout:
        if callable(what):
            what = what()
        seen = []
        if self.value is not _NOTHING:
            seen.append(f"last value {self.value!r}")
        if self.error is not None:
            seen.append(f"last error {self.error!r}")
        detail = "; ".join(seen) or "never evaluated"
        return WaitTimeout(f"timed out after {timeout:g} s waiting for {what} ({detail})")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: What,
    *,
    interval: float = INTERVAL_S,
    ignore: Errors = (Exception,),
    fatal: Errors = (),
) -> T:
    """Block until ``predicate()`` is truthy and return that value (see module doc)."""
    deadline = time.monotonic() + timeout
    last = _Last()
    while True:
        try:
            value = predicate()
        except fatal:
            raise
        except ignore as exc:
            last.error = exc
        else:
            if value:
                last.error = None  # see _Last
                return value
            last.value = value
        if time.monotonic() >= deadline:
            raise last.timeout(what, timeout) from last.error
        time.sleep(interval)


def seconds_until(
    predicate: Callable[[], object],
    timeout: float,
    what: What,
    *,
    interval: float = INTERVAL_S,
    ignore: Errors = (Exception,),
    fatal: Errors = (),
) -> float:
    """Block until ``predicate()`` is truthy, as :func:`wait_until`; the seconds it took."""
    started = time.monotonic()
    wait_until(predicate, timeout, what, interval=interval, ignore=ignore, fatal=fatal)
    return time.monotonic() - started


@overload
async def wait_until_async(
    predicate: Callable[[], Awaitable[T]],
    timeout: float,  # noqa: ASYNC109 - a polling deadline, not a cancellation scope
    what: What,
    *,
    interval: float = ...,
    ignore: Errors = ...,
    fatal: Errors = ...,
) -> T: ...


@overload
async def wait_until_async(
    predicate: Callable[[], T],
    timeout: float,  # noqa: ASYNC109
    what: What,
    *,
    interval: float = ...,
    ignore: Errors = ...,
    fatal: Errors = ...,
) -> T: ...


async def wait_until_async(
    predicate: Callable[[], Any],
    timeout: float,  # noqa: ASYNC109 - a polling deadline, not a cancellation scope
    what: What,
    *,
    interval: float = ASYNC_INTERVAL_S,
    ignore: Errors = (Exception,),
    fatal: Errors = (),
) -> Any:
    """:func:`wait_until` for async tests; ``predicate`` may be a plain or an async
    function (or return an awaitable)."""
    deadline = time.monotonic() + timeout
    last = _Last()
    while True:
        try:
            result = predicate()
            value = await result if inspect.isawaitable(result) else result
        except fatal:
            raise
        except ignore as exc:
            last.error = exc
        else:
            if value:
                last.error = None  # see _Last
                return value
            last.value = value
        if time.monotonic() >= deadline:
            raise last.timeout(what, timeout) from last.error
        await asyncio.sleep(interval)
