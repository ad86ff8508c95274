"""The admin API as a runtime component (docs/design.md §5.4): wiring, and the backend
the servicer calls (``servers.admin``, the thin gRPC adapter).

Where it listens (``admin`` config, read once at start):
- ``admin.grpc`` unset: on the main gRPC server (``server.grpc``, 127.0.0.1:18000 by
  default), next to xDS. No extra port, so parallel instances never collide on one.
  If ``server.grpc`` is not loopback (remote Envoys) and no ``admin.token`` is set, the
  admin API is NOT served there (a warning says so): it never becomes reachable from the
  network without a token.
- ``admin.grpc`` set: its own grpc.aio server on that address, bound at registration
  (so a taken port fails the start like the main server does) and started by this
  component's task. A non-loopback ``admin.grpc`` without a token is a config error.
With ``admin.token`` every call must carry ``authorization: Bearer <token>``.
Every answer's reasons and probe details are scrubbed of every configured secret (the
runtime's ``ops.secret_scrubbing.Secrets``): they may quote what a backend answered.

Board changes go through ``BoardControl.update`` (which publishes to xDS and watchers);
drain/undrain transitions are logged and observed via ``BoardControl.notify``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client.metrics_core import Metric

from llm_health.admin.settings import AdminConfig
from llm_health.core.addresses import is_local_bind
from llm_health.core.component import Job
from llm_health.core.control import BoardControl, OperatorAction
from llm_health.core.families import counter
from llm_health.model.board import Board, EndpointSnapshot, HealthSnapshot
from llm_health.model.machine import Transition
from llm_health.model.states import State
from llm_health.ops.secret_scrubbing import Secrets
from llm_health.servers.admin import (
    AdminServicer,
    AuthStats,
    Changed,
    NotReady,
    Probed,
    add_admin_service,
)
from llm_health.servers.grpc import bind_grpc, create_grpc_server

STOP_GRACE_S = 0.5
log = logging.getLogger("llm_health.admin")


class AdminComponent:
    """``Component`` (core/component.py) and ``AdminBackend`` (servers/admin.py) in one.
    ``shared_grpc``: the main gRPC server's address (``server.grpc``);
    ``shared_authenticated``: that server checks a token or client certificates on every
    call (``server.token`` / ``server.tls.client_ca``), so the admin API may share it.
    ``secrets``: the runtime's, scrubbed from every answer (``redact``)."""

    name = "admin"

    def __init__(
        self,
        settings: AdminConfig,
        shared_grpc: str,
        control: BoardControl,
        *,
        shared_authenticated: bool = False,
        secrets: Secrets | None = None,
    ) -> None:
        self._control = control
        self._secrets = secrets if secrets is not None else Secrets()
        self._shared = shared_grpc
        self._shared_authenticated = shared_authenticated
        self._bind = settings.grpc
        self._token = settings.token.get_secret_value() if settings.token else None
        self.stats = AuthStats()  # calls to the API and those refused (status, metrics)
        self._own: grpc.aio.Server | None = None
        self.listen: str | None = None  # where the API is served; None: not served
        self.port: int | None = None  # bound TCP port of its own server (0: Unix socket)

    # --- Component ------------------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        servicer = AdminServicer(self)
        if self._bind is not None:
            self._own = create_grpc_server()
            self.port = bind_grpc(self._own, self._bind)
            add_admin_service(self._own, servicer, self._token, self.stats)
            self.listen = self._bind
            return
        shared = self._shared
        if self._token is None and not (is_local_bind(shared) or self._shared_authenticated):
            log.warning(
                "admin API not served: server.grpc is not loopback, admin.token is unset and "
                "the server authenticates nobody (set admin.token or server.token, or "
                "admin.grpc to a loopback address)",
                extra={"grpc": shared},
            )
            return
        add_admin_service(server, servicer, self._token, self.stats)
        self.listen = shared

    def tasks(self) -> list[Job]:
        return [self._serve_own] if self._own is not None else []

    def status(self) -> dict[str, Any]:
        return {
            "grpc": self.listen,
            "auth": "bearer token" if self._token else "none",
            "calls_total": self.stats.calls,
            "unauthenticated_total": self.stats.rejected,
        }

    def metrics(self) -> Iterator[Metric]:
        yield counter("llm_health_admin_calls_total", "Admin API calls.", self.stats.calls)
        yield counter(
            "llm_health_admin_unauthenticated_total",
            "Admin API calls refused: no or wrong admin.token.",
            self.stats.rejected,
        )

    async def _serve_own(self) -> None:
        assert self._own is not None
        await self._own.start()
        log.info("admin API serving", extra={"grpc": self._bind})
        try:
            await asyncio.Event().wait()  # until cancelled at shutdown
        finally:
            await self._own.stop(STOP_GRACE_S)

    # --- AdminBackend ---------------------------------------------------------------------

    def snapshot(self) -> HealthSnapshot:
        return self._control.snapshot()

    def redact(self, text: str) -> str:
        return self._secrets.redact(text)

    def published(self) -> HealthSnapshot:
        return self._control.published()

    async def wait_newer(self, revision: int) -> HealthSnapshot:
        return await self._control.wait_newer(revision)

    async def drain(self, cluster: str, address: str, reason: str) -> Changed:
        changed = await self._transition(
            cluster, address, lambda board, now: board.drain(cluster, address, now, reason)
        )
        self._control.share_action(OperatorAction("drain", cluster, address, reason))
        return changed

    async def undrain(self, cluster: str, address: str) -> Changed:
        if self._endpoint(cluster, address).removing:
            raise ValueError(f"{cluster}/{address} is being removed from the config")
        changed = await self._transition(
            cluster, address, lambda board, now: board.undrain(cluster, address, now)
        )
        self._control.share_action(OperatorAction("undrain", cluster, address))
        return changed

    async def force(
        self, cluster: str, address: str, state: State, duration_s: float, reason: str
    ) -> Changed:
        before = self._endpoint(cluster, address)
        why = reason or f"forced {state.value} by operator"
        await self._control.update(
            lambda board, now: board.set_override(cluster, address, state, now + duration_s, why)
        )
        until = time.time() + duration_s
        self._control.share_action(OperatorAction("force", cluster, address, why, state, until))
        after = self._endpoint(cluster, address)
        log.info(
            "override set",
            extra={
                "cluster": cluster,
                "endpoint": address,
                "from": before.state.value,
                "to": state.value,
                "reason": why,
                "for_s": round(duration_s, 3),
            },
        )
        return Changed(after, changed=True)

    async def clear_override(self, cluster: str, address: str) -> Changed:
        before = self._endpoint(cluster, address)
        had = await self._control.update(lambda board, _now: board.clear_override(cluster, address))
        self._control.share_action(OperatorAction("clear", cluster, address))
        after = self._endpoint(cluster, address)
        if had:
            log.info(
                "override cleared",
                extra={
                    "cluster": cluster,
                    "endpoint": address,
                    "from": before.state.value,
                    "to": after.state.value,
                    "reason": after.reason,
                },
            )
        return Changed(after, changed=had)

    async def probe_now(self, cluster: str, address: str) -> Probed:
        self._endpoint(cluster, address)  # KeyError first: unknown beats "not ready"
        try:
            result, trusted = await self._control.probe_now(cluster, address)
        except RuntimeError as exc:
            raise NotReady(str(exc)) from exc
        return Probed(result, self._endpoint(cluster, address), ignored=not trusted)

    # --- helpers --------------------------------------------------------------------------

    async def _transition(
        self, cluster: str, address: str, change: Callable[[Board, float], Transition]
    ) -> Changed:
        transition = await self._control.update(change)
        if transition.changed:
            self._control.notify(cluster, address, transition, None)
        return Changed(self._endpoint(cluster, address), transition.changed)

    def _endpoint(self, cluster: str, address: str) -> EndpointSnapshot:
        snapshot = self._control.snapshot()
        for endpoint in snapshot.clusters[cluster].endpoints:
            if endpoint.spec.address == address:
                return endpoint
        raise KeyError(f"{cluster}/{address}")
