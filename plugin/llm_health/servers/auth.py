"""Authentication of the main gRPC server (``server.token``, ``server.tls``): the one rule
every gRPC surface on it uses, and the ``grpc_auth`` part of /status.

Built by ``app.assemble`` from the ``server`` section. ``GrpcAuth.security`` is handed to
the runtime, which calls it when it creates the gRPC server, and to ext_authz for its own
server (``server.authz``). /status shows ``{"mode": "bearer token" | "mtls" | "mtls +
bearer token" | "none", "rejected_total": N, "tls": bool}``, /metrics
``llm_health_grpc_auth_rejected_total`` and ``llm_health_grpc_auth_tls``. The token itself
is never shown.

- ``server.token``: one ``BearerTokenInterceptor`` guards every service on the port (xDS,
  HDS, ext_authz, and the admin API when it shares the port), loopback included, and
  the same token guards ext_authz's own port (``server.authz``) when it has one. The
  admin API keeps its own ``admin.token`` check when one is set (``exempt_admin``): its
  methods are then exempt here (admin clients present the admin token).
- ``server.tls``: the port (and ``server.authz``'s) speaks TLS; with ``client_ca``
  clients need a certificate signed by it (mutual TLS). Certificates are read at start.

``authenticated`` (token or mutual TLS) tells HDS that its reporters are trusted, which
lifts the max_ejection_percent cap on HDS verdicts (docs/design.md §7.6).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from prometheus_client.metrics_core import Metric

from llm_health.config import ServerConfig
from llm_health.core.families import counter, gauge
from llm_health.servers.grpc import (
    BearerTokenInterceptor,
    GrpcAuthStats,
    ThreadedBearerTokenInterceptor,
    server_credentials,
)

ADMIN_METHODS = "/llm_health.v1.Admin/"


@dataclass(frozen=True, slots=True)
class PortSecrets:
    """The token and TLS files' bytes, read at start: what the admission process
    (``server.authz_isolation: process``) is handed over its pipe to guard its port as the
    main one is guarded. ``repr`` shows none of them."""

    token: str | None = field(default=None, repr=False)
    cert: bytes | None = field(default=None, repr=False)
    key: bytes | None = field(default=None, repr=False)
    client_ca: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class GrpcSecurity:
    """What ``start_grpc_server`` needs: interceptors and (TLS) credentials; and the same
    rule for a threaded server (``server.authz``): ``threaded_interceptors``; and for a
    process of its own: ``secrets`` (``port_security`` rebuilds the rest from them). The
    default: no authentication."""

    interceptors: tuple[grpc.aio.ServerInterceptor, ...] = ()
    credentials: grpc.ServerCredentials | None = None
    threaded_interceptors: tuple[grpc.ServerInterceptor, ...] = ()
    secrets: PortSecrets = PortSecrets()


def port_security(
    secrets: PortSecrets, stats: GrpcAuthStats, *, exempt: tuple[str, ...] = ()
) -> GrpcSecurity:
    """Interceptors and credentials from the token and the TLS bytes; rejections counted
    in ``stats``; ``exempt``: method prefixes the token check skips."""
    interceptors: tuple[grpc.aio.ServerInterceptor, ...] = ()
    threaded: tuple[grpc.ServerInterceptor, ...] = ()
    if secrets.token is not None:
        token = secrets.token
        interceptors = (BearerTokenInterceptor(token, stats=stats, exempt=exempt),)
        threaded = (ThreadedBearerTokenInterceptor(BearerTokenInterceptor(token, stats=stats)),)
    credentials = None
    if secrets.cert is not None and secrets.key is not None:
        credentials = server_credentials(secrets.cert, secrets.key, secrets.client_ca)
    return GrpcSecurity(interceptors, credentials, threaded, secrets)


SecurityProvider = Callable[[], GrpcSecurity]  # reads the TLS files: call it at start


class GrpcAuth:
    name = "grpc_auth"

    def __init__(self, server: ServerConfig, *, exempt_admin: bool = False) -> None:
        """``exempt_admin``: the admin API shares this port and checks its own token."""
        self._server = server
        self._exempt_admin = exempt_admin
        token = server.token is not None
        mtls = server.tls is not None and server.tls.client_ca is not None
        mode = " + ".join(m for m, on in (("mtls", mtls), ("bearer token", token)) if on)
        self.stats = GrpcAuthStats(mode or "none")
        self.authenticated = token or mtls

    def security(self) -> GrpcSecurity:
        """Interceptors and credentials for the main gRPC server (reads the TLS files)."""
        token, tls = self._server.token, self._server.tls
        secrets = PortSecrets(
            token.get_secret_value() if token is not None else None,
            tls.cert.read_bytes() if tls is not None else None,
            tls.key.read_bytes() if tls is not None else None,
            tls.client_ca.read_bytes() if tls is not None and tls.client_ca else None,
        )
        exempt = (ADMIN_METHODS,) if self._exempt_admin else ()
        return port_security(secrets, self.stats, exempt=exempt)

    def register(self, server: grpc.aio.Server) -> None:
        """Nothing to register: the interceptor is installed when the server is created."""

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        return []

    def status(self) -> dict[str, Any]:
        return {**self.stats.as_dict(), "tls": self._server.tls is not None}

    def metrics(self) -> Iterator[Metric]:
        yield counter(
            "llm_health_grpc_auth_rejected_total",
            "gRPC calls refused: no or wrong bearer token (server.token).",
            self.stats.rejected_total,
        )
        yield gauge(
            "llm_health_grpc_auth_tls",
            "1 when the main gRPC port speaks TLS (server.tls).",
            self._server.tls is not None,
        )
