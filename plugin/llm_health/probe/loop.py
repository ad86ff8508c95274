"""Which event loop a process runs (``server.event_loop``, ``agent.event_loop``; docs/
design.md §16.10): uvloop (libuv) or asyncio's own. uvloop costs ``serve`` less CPU per
probe, with everything it serves (``bench/probe_vs_envoy.py``); ``asyncio`` stays
as the way back should a platform's uvloop misbehave. A probe worker process runs the loop
its runtime chose (``WORKER_ENV``)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import AfterValidator

EventLoop = Literal["auto", "asyncio", "uvloop"]
EVENT_LOOPS: tuple[EventLoop, ...] = get_args(EventLoop)
WORKER_ENV = "LLM_HEALTH_EVENT_LOOP"  # the loop a probe worker runs ("asyncio" | "uvloop")
T = TypeVar("T")


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: str) -> Literal["asyncio", "uvloop"]:
    """The loop ``choice`` means here: "auto" is uvloop when installed. ValueError for
    "uvloop" without uvloop, or a name that is no loop."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"event loop {choice!r}: one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio":
        return "asyncio"
    if uvloop_installed():
        return "uvloop"
    if choice == "uvloop":
        raise ValueError("event loop uvloop: the uvloop package is not installed")
    return "asyncio"


def _available(choice: EventLoop) -> EventLoop:
    resolve(choice)
    return choice


# The settings field: a choice this machine can honour (uvloop named but absent: refused).
EventLoopSetting = Annotated[EventLoop, AfterValidator(_available)]


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory for ``asyncio.Runner`` (None: asyncio's default loop)."""
    if resolve(choice) == "asyncio":
        return None
    import uvloop

    return uvloop.new_event_loop


def running_loop_name() -> Literal["asyncio", "uvloop"]:
    """The loop this coroutine runs on, as ``WORKER_ENV`` names it."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """``asyncio.run(main)`` on the loop ``choice`` resolves to."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)


def child_env() -> dict[str, str]:
    """The environment of a child process of ours (a probe worker, the admission
    process): it imports this package from where its parent did (a source checkout run
    with ``plugin/`` on sys.path works as well as an installed wheel), and runs its
    parent's event loop (``WORKER_ENV``). Call from inside the running loop."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env[WORKER_ENV] = running_loop_name()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env
