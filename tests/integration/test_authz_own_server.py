"""ext_authz on its own gRPC port (``server.authz``, docs/design.md §16.9), in a process
of its own (``server.authz_isolation: process``, the default) or on threads: the real
runtime probing a simulator; checks go to the own port from a thread of the test.

- A check is answered while the runtime's event loop is blocked (the test blocks it):
  admission does not wait for the loop that times the probes.
- Its answer follows the published health (a FATAL engine: denied, 503 no_capacity).
- The token of ``server.token`` guards the port; undecodable bytes get INVALID_ARGUMENT;
  the main gRPC port no longer serves ``Check``.
- The process killed, or stopped (it no longer reports): it is restarted, fed the view
  again, and the counts it reported are kept. ``threads`` still serves.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc

from llm_health.app.runtime import Runtime
from llm_health.model.states import State
from tests.configs import plugin_yaml
from tests.polling import wait_until_async
from tests.ports import free_port
from tests.processes import SimProcess
from tests.runtime import Running

pytestmark = [pytest.mark.timeout(60), pytest.mark.sim_args("--ttft", "20ms")]

TOKEN = "own-authz-token-0123456789"
OK, PERMISSION_DENIED = 0, 7
BLOCK_S = 1.5


@dataclass
class Own:
    runtime: Runtime
    sim: SimProcess
    authz: int
    grpc: int

    def check(self, port: int | None = None, token: str | None = TOKEN) -> Any:
        """One Check, synchronously (call from a thread, never from the loop)."""
        request = external_auth_pb2.CheckRequest()
        request.attributes.context_extensions["llm_cluster"] = "llama"
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        with grpc.insecure_channel(f"127.0.0.1:{port or self.authz}") as channel:
            stub = external_auth_pb2_grpc.AuthorizationStub(channel)
            return stub.Check(request, timeout=5, metadata=metadata)


def config_text(sim: SimProcess, authz: int, isolation: str = "process") -> str:
    """Probing ``sim``; ext_authz on its own port ``authz``, behind ``server.token``."""
    return plugin_yaml(
        [sim],
        server={"authz": f"127.0.0.1:{authz}", "token": TOKEN, "authz_isolation": isolation},
        probe={"interval": "200ms", "timeout": "800ms", "model": "sim-model"},
    )


def own(runtime: Runtime) -> dict[str, Any]:
    found: dict[str, Any] = runtime.status()["authz"]["own_server"]
    return found


def own_serving(runtime: Runtime) -> bool:
    return bool(own(runtime)["serving"])


def healthy(runtime: Runtime) -> bool:
    cluster = runtime.control.snapshot().clusters["llama"]
    return all(e.state is State.HEALTHY for e in cluster.endpoints)


def checks(runtime: Runtime) -> int:
    return int(runtime.status()["authz"]["checks"])


@pytest.fixture
async def running(sim_process: SimProcess) -> AsyncIterator[Own]:
    authz = free_port()
    text = config_text(sim_process, authz)
    async with Running.from_config(text, "own-authz.yaml") as started:
        runtime = started.runtime
        await wait_until_async(lambda: healthy(runtime), 20, "the endpoint healthy")
        await wait_until_async(lambda: own_serving(runtime), 20, "the own port serving")
        yield Own(runtime, sim_process, authz, runtime.grpc_port)


@pytest.mark.timed  # it blocks its own loop for 1.5 s; the answer must come meanwhile
async def test_a_check_is_answered_while_the_runtime_loop_is_blocked(running: Own) -> None:
    answered: list[tuple[float, Any]] = []

    def ask() -> None:
        response = running.check()
        answered.append((time.monotonic(), response))

    asker = threading.Thread(target=ask)
    blocked_at = time.monotonic()
    asker.start()
    time.sleep(BLOCK_S)  # noqa: ASYNC251 (deliberately blocking the runtime's loop)
    unblocked_at = time.monotonic()
    await asyncio.to_thread(asker.join, 10)
    assert answered, "no answer at all"
    at, response = answered[0]
    assert response.status.code == OK
    assert blocked_at < at < unblocked_at, (
        f"answered {at - blocked_at:.2f} s after the block began; it lasted {BLOCK_S} s"
    )


async def test_the_answer_follows_the_published_health(running: Own) -> None:
    assert (await asyncio.to_thread(running.check)).status.code == OK
    running.sim.set_fault(fault="cuda_error")

    def out() -> bool:
        cluster = running.runtime.control.snapshot().clusters["llama"]
        return all(e.state is State.UNHEALTHY for e in cluster.endpoints)

    await wait_until_async(out, 15, "the endpoint taken out")
    # The board's verdict reaches the admission process through the published snapshot
    # and the pipe, a hop after the board: on loaded cores the first check can still
    # find the former view, so the denial is awaited (bounded), not expected at once.
    denied: list[Any] = []

    async def denies() -> bool:
        denied[:] = [await asyncio.to_thread(running.check)]
        return bool(denied[0].status.code == PERMISSION_DENIED)

    await wait_until_async(denies, 5, "the check denied")
    assert denied[0].denied_response.status.code == 503
    status = running.runtime.status()["authz"]
    own = status["own_server"]
    assert (own["listen"], own["serving"], own["isolation"]) == (
        f"127.0.0.1:{running.authz}",
        True,
        "process",
    )

    def counted() -> bool:  # the process reports its counters every second
        decisions = running.runtime.status()["authz"]["decisions"]
        return bool(decisions.get("llama", {}).get("no_capacity", 0) >= 1)

    await wait_until_async(counted, 5, "the denial counted")


async def test_the_port_needs_the_token_and_decodable_requests(running: Own) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        await asyncio.to_thread(running.check, None, None)
    assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as wrong:
        await asyncio.to_thread(running.check, None, "x" * 26)
    assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED

    def junk() -> Any:
        with grpc.insecure_channel(f"127.0.0.1:{running.authz}") as channel:
            call = channel.unary_unary("/envoy.service.auth.v3.Authorization/Check")
            return call(
                b"\xff\xff\xff\xff", timeout=5, metadata=(("authorization", f"Bearer {TOKEN}"),)
            )

    with pytest.raises(grpc.RpcError) as undecodable:
        await asyncio.to_thread(junk)
    assert undecodable.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await asyncio.to_thread(running.check)).status.code == OK


async def test_the_main_port_no_longer_serves_check(running: Own) -> None:
    with pytest.raises(grpc.RpcError) as info:
        await asyncio.to_thread(running.check, running.grpc)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_taken_authz_port_is_reported_and_the_service_goes_on(
    sim_process: SimProcess,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with Running.from_config(config_text(sim_process, port), "taken.yaml") as started:
            runtime = started.runtime

            def reported() -> bool:
                own = runtime.status()["authz"]["own_server"]
                return bool(own.get("error"))

            await wait_until_async(reported, 15, "the bind failure in /status")
            own = runtime.status()["authz"]["own_server"]
            assert own["serving"] is False and str(port) in own["error"]
            assert runtime.grpc_serving and started.task is not None
            assert not started.task.done()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
async def test_a_lost_admission_process_is_restarted_and_its_counts_kept(
    running: Own, how: signal.Signals
) -> None:
    """Killed: it exits and is started again. Stopped: it no longer reports, and is killed
    after SILENT_S (10 s), then started again. Either way the new one answers from the
    view it is sent again, and the counts of the first never leave the totals."""
    assert (await asyncio.to_thread(running.check)).status.code == OK
    await wait_until_async(lambda: checks(running.runtime) >= 1, 5, "the check counted")
    before, first = checks(running.runtime), own(running.runtime)["pid"]
    os.kill(first, how)
    seen: list[int] = []

    def replaced() -> bool:
        seen.append(checks(running.runtime))
        now = own(running.runtime)
        return bool(now["serving"] and now["pid"] not in (None, first))

    await wait_until_async(replaced, 25, "a new admission process serving")
    assert min(seen) >= before, f"the counts went down: {before} then {min(seen)}"
    assert own(running.runtime)["restarts"] >= 1
    assert (await asyncio.to_thread(running.check)).status.code == OK
    await wait_until_async(
        lambda: checks(running.runtime) >= before + 1, 5, "the new process's check counted"
    )
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)  # the first one is gone, not left behind


async def test_threads_isolation_serves_on_threads(sim_process: SimProcess) -> None:
    port = free_port()
    text = config_text(sim_process, port, isolation="threads")
    async with Running.from_config(text, "threads.yaml") as started:
        runtime = started.runtime
        await wait_until_async(lambda: healthy(runtime), 20, "the endpoint healthy")
        await wait_until_async(lambda: own_serving(runtime), 20, "the own port serving")
        assert own(runtime)["isolation"] == "threads" and "pid" not in own(runtime)
        response = await asyncio.to_thread(Own(runtime, sim_process, port, 0).check)
        assert response.status.code == OK
        assert checks(runtime) == 1  # counted at once: the same process
