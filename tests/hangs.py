"""What a hung test was waiting for: the stacks of every asyncio task, printed shortly
before pytest-timeout ends the test (its own dump shows threads only, and a hung asyncio
test's main thread is always idle in ``select``)."""

from __future__ import annotations

import asyncio
import gc
import io
import sys
import threading

EARLY_S = 3.0  # printed this long before the timeout fires


def running_loops() -> list[asyncio.AbstractEventLoop]:
    return [
        o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()
    ]


def task_stacks(loop: asyncio.AbstractEventLoop) -> str:
    """Every pending task of ``loop`` with its stack (read from another thread: a best
    effort, good enough for a diagnosis)."""
    out = io.StringIO()
    for task in list(asyncio.all_tasks(loop)):
        out.write(f"--- {task.get_name()}: {task.get_coro()!r}\n")
        # Not task.print_stack: it reads source lines, and a frame of compiled code
        # (grpc's Cython) has no line number, which made the dump itself fail.
        for frame in task.get_stack(limit=12):
            code = frame.f_code
            out.write(f"  {code.co_filename}:{frame.f_lineno} in {code.co_name}\n")
    return out.getvalue()


def dump_tasks(nodeid: str) -> None:
    text = "".join(task_stacks(loop) for loop in running_loops())
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"\n+++ asyncio tasks of {nodeid} before its timeout +++\n{text}")
    stream.flush()


def start_watch(nodeid: str, timeout_s: float) -> threading.Timer | None:
    if timeout_s <= EARLY_S:
        return None
    timer = threading.Timer(timeout_s - EARLY_S, dump_tasks, (nodeid,))
    timer.daemon = True
    timer.start()
    return timer
