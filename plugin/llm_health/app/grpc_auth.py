"""Authentication of the main gRPC server (``server.token``, ``server.tls``) as a component.

Built by ``app.assemble`` from the ``server`` and ``admin`` sections; the runtime asks it
for the interceptors and credentials when it creates the gRPC server (``security()``),
and /status shows its ``grpc_auth`` part: ``{"mode": "bearer token" | "mtls" |
"mtls + bearer token" | "none", "rejected_total": N}``. The token itself is never shown.

- ``server.token``: one ``BearerTokenInterceptor`` guards every service on the port (xDS,
  HDS, ext_authz, and the admin API when it shares the port), loopback included, and
  the same token guards ext_authz's own port (``server.authz``) when it has one. The
  admin API keeps its own ``admin.token`` check when one is set: its methods are then
  exempt here (admin clients present the admin token).
- ``server.tls``: the port (and ``server.authz``'s) speaks TLS; with ``client_ca``
  clients need a certificate signed by it (mutual TLS). Certificates are read at start.

``authenticated`` (token or mutual TLS) tells HDS that its reporters are trusted, which
lifts the max_ejection_percent cap on HDS verdicts (app/hds.py).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc

from llm_health.admin.settings import AdminConfig
from llm_health.config import ServerConfig
from llm_health.servers.grpc import (
    BearerTokenInterceptor,
    GrpcAuthStats,
    ThreadedBearerTokenInterceptor,
    server_credentials,
)

ADMIN_METHODS = "/llm_health.v1.Admin/"


@dataclass(frozen=True, slots=True)
class GrpcSecurity:
    """What ``start_grpc_server`` needs: interceptors and (TLS) credentials; and the same
    rule for a threaded server (``server.authz``): ``threaded_interceptors``."""

    interceptors: tuple[grpc.aio.ServerInterceptor, ...] = ()
    credentials: grpc.ServerCredentials | None = None
    threaded_interceptors: tuple[grpc.ServerInterceptor, ...] = ()


class GrpcAuthComponent:
    name = "grpc_auth"

    def __init__(self, server: ServerConfig, admin: AdminConfig) -> None:
        self._server = server
        self._admin_has_token = admin.token is not None and admin.grpc is None
        token = server.token is not None
        mtls = server.tls is not None and server.tls.client_ca is not None
        mode = " + ".join(m for m, on in (("mtls", mtls), ("bearer token", token)) if on)
        self.stats = GrpcAuthStats(mode or "none")
        self.authenticated = token or mtls

    def security(self) -> GrpcSecurity:
        """Interceptors and credentials for the main gRPC server (reads the TLS files)."""
        interceptors: tuple[grpc.aio.ServerInterceptor, ...] = ()
        threaded: tuple[grpc.ServerInterceptor, ...] = ()
        if self._server.token is not None:
            token = self._server.token.get_secret_value()
            exempt = (ADMIN_METHODS,) if self._admin_has_token else ()
            interceptors = (BearerTokenInterceptor(token, stats=self.stats, exempt=exempt),)
            threaded = (
                ThreadedBearerTokenInterceptor(BearerTokenInterceptor(token, stats=self.stats)),
            )
        credentials = None
        tls = self._server.tls
        if tls is not None:
            credentials = server_credentials(
                tls.cert.read_bytes(),
                tls.key.read_bytes(),
                tls.client_ca.read_bytes() if tls.client_ca is not None else None,
            )
        return GrpcSecurity(interceptors, credentials, threaded)

    def register(self, server: grpc.aio.Server) -> None:
        """Nothing to register: the interceptor is installed when the server is created."""

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        return []

    def status(self) -> dict[str, Any]:
        return {**self.stats.as_dict(), "tls": self._server.tls is not None}
