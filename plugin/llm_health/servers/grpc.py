"""The plugin's gRPC servers: options, binding, authentication, and the bind error. No
servicer here.

``start_grpc_server`` builds the one gRPC server the plugin runs (xDS, HDS, ext_authz and
admin servicers are all registered on it); ``create_grpc_server`` + ``bind_grpc`` serve a
component that listens on its own address (the admin API's ``admin.grpc``).
``create_threaded_grpc_server`` is a synchronous gRPC server whose calls run in its own
threads, never on the event loop (ext_authz on ``server.authz``: docs/design.md §16.9);
``ThreadedBearerTokenInterceptor`` guards it with the same token.

Authentication of the main server (``server.token``, ``server.tls``):
- ``BearerTokenInterceptor``: every call must carry ``authorization: Bearer <token>``
  (Envoy: ``initial_metadata`` on its ``grpc_service``); anything else is answered
  UNAUTHENTICATED before any servicer runs. The comparison is constant-time; the token is
  never logged nor put in a status message (``core.tokens``). Rejections are counted
  (``GrpcAuthStats``) and logged at most once per peer host per minute (``core.problems``:
  a bounded table).
- ``server_credentials``: TLS, and with a client CA mutual TLS (gRPC refuses the
  handshake of a client without a certificate signed by it; such refusals happen in the
  TLS layer and are not counted here).
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from llm_health.core.problems import peer_host
from llm_health.core.tokens import bearer_matches, expected_value, refusal_log
from llm_health.errors import LLMHealthError

_LOG = logging.getLogger("llm_health.grpc")

MAX_RECEIVE_BYTES = 3 * 1024 * 1024
GRPC_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    # grpcio sets SO_REUSEPORT by default: a second instance would silently share the port
    # and half of the Envoys would talk to it (docs/design.md §7).
    ("grpc.so_reuseport", 0),
    # xDS streams live for hours and may be idle for minutes. Ping the peer every 30 s so a
    # vanished Envoy is noticed (20 s to answer) ...
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # ... and accept Envoy's own HTTP/2 keepalive pings (http2_protocol_options.
    # connection_keepalive; shipped configs: every 30 s) on a stream with nothing to send.
    # gRPC's defaults (at most one ping per 5 min without data, 2 strikes) answer them with
    # GOAWAY "too_many_pings" and Envoy reconnects over and over (seen with Envoy 1.40;
    # tests/integration/test_xds_envoy.py). 0 strikes = never GOAWAY for pings.
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
    # A request is parsed on the event loop before any of our code sees it: a delta
    # request's resource-version map parses at ~0.2 s per MB (upb), so gRPC's 4 MiB default
    # lets one peer stall the probes' timing for ~0.8 s. 3 MiB (~0.55 s worst) still holds
    # 300,000 subscribed names or an HDS report of ~60,000 endpoints. With server.token
    # the interceptor refuses an unauthenticated call before any message is parsed.
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
)


class GrpcBindError(LLMHealthError, OSError):
    """The gRPC server could not bind its address (in use, or not permitted)."""


def create_grpc_server(
    options: Sequence[tuple[str, Any]] = GRPC_SERVER_OPTIONS,
    *,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> grpc.aio.Server:
    """A grpc.aio server with the plugin's options (must run inside the event loop)."""
    server: grpc.aio.Server = grpc.aio.server(
        options=tuple(options), interceptors=tuple(interceptors) or None
    )
    return server


def create_threaded_grpc_server(
    options: Sequence[tuple[str, Any]] = GRPC_SERVER_OPTIONS,
    *,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
    threads: int = 4,
) -> grpc.Server:
    """A synchronous gRPC server: its calls run on ``threads`` threads of its own, so they
    are answered while the event loop is busy (they still share the interpreter lock,
    which a busy thread yields every ``sys.getswitchinterval()``, 5 ms by default). gRPC
    core's completion queue of this server is its own, not grpc.aio's (grpc.aio servers on
    two event loops in two threads share one notification socket)."""
    server: grpc.Server = grpc.server(
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="llm-health-grpc"),
        options=tuple(options),
        interceptors=tuple(interceptors) or None,
    )
    return server


def bind_grpc(
    server: grpc.aio.Server | grpc.Server,
    bind: str,
    credentials: grpc.ServerCredentials | None = None,
) -> int:
    """Bind ``host:port`` or ``unix:/path``: insecure, or with ``credentials`` (TLS, see
    ``server_credentials``).

    Returns the bound port (0 for Unix sockets). Raises ``GrpcBindError`` when the address
    is taken: gRPC would silently replace a live Unix socket file, so that is checked first.
    """
    unix = bind.startswith("unix:")
    if unix:
        _check_unix_socket_free(bind.removeprefix("unix:").removeprefix("//"))
    try:
        if credentials is None:
            port: int = server.add_insecure_port(bind)
        else:
            port = server.add_secure_port(bind, credentials)
    except RuntimeError as exc:
        raise _bind_error(bind, tls=credentials is not None) from exc
    if port == 0:  # older grpcio reported a failed bind this way
        raise _bind_error(bind, tls=credentials is not None)
    return 0 if unix else port


async def start_grpc_server(
    bind: str,
    *,
    options: Sequence[tuple[str, Any]] = GRPC_SERVER_OPTIONS,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Create the plugin's gRPC server and bind ``bind``; returns ``(server, port)``.

    Not started yet: the caller registers its servicers (``add_xds_servicers`` ...) and
    then ``await server.start()``; stop it with ``await server.stop(grace_s)``. ``port`` is
    the bound TCP port (useful with ``:0``), 0 for a Unix socket. Raises ``GrpcBindError``.
    ``interceptors`` (e.g. a ``BearerTokenInterceptor``) see every call; ``credentials``
    make the port TLS. Call from inside the event loop that will run the server.
    """
    server = create_grpc_server(options, interceptors=interceptors)
    port = bind_grpc(server, bind, credentials)
    _LOG.info("gRPC server bound to %s%s", bind, " (TLS)" if credentials else "")
    return server, port


# --------------------------------------------------------------------------- authentication

UNAUTHENTICATED_MESSAGE = "missing or wrong authorization bearer token (server.token)"


@dataclass(slots=True)
class GrpcAuthStats:
    """What /status shows under ``grpc_auth``. ``mode``: "bearer token", "mtls",
    "mtls + bearer token" or "none"."""

    mode: str = "none"
    rejected_total: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "rejected_total": self.rejected_total}


def server_credentials(
    cert_chain: bytes, private_key: bytes, client_ca: bytes | None = None
) -> grpc.ServerCredentials:
    """TLS for a server port; with ``client_ca`` clients must present a certificate signed
    by it (mutual TLS), else the handshake fails."""
    return grpc.ssl_server_credentials(
        [(private_key, cert_chain)],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


Behaviour = Callable[..., Any]


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every call must carry ``authorization: Bearer <token>``; else UNAUTHENTICATED.

    ``exempt``: method-name prefixes that authenticate themselves (e.g. the admin API
    when it has its own ``admin.token``: ``"/llm_health.v1.Admin/"``). A rejected call
    gets a handler of the same streaming kind as the real one (grpc.aio requires it)
    that counts, logs (rate-limited per peer host) and aborts; the servicer never runs.
    """

    def __init__(
        self,
        token: str,
        *,
        stats: GrpcAuthStats | None = None,
        exempt: Collection[str] = (),
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger = _LOG,
    ) -> None:
        self._expected = expected_value(token)
        self.stats = stats if stats is not None else GrpcAuthStats("bearer token")
        self._exempt = tuple(exempt)
        self._refusals = refusal_log(log, clock)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or self.allowed(details):
            return handler
        return self._rejecting(handler, details.method)

    def allowed(self, details: grpc.HandlerCallDetails) -> bool:
        method = details.method or ""
        if self._exempt and method.startswith(self._exempt):
            return True
        return bearer_matches(details.invocation_metadata, self._expected)

    def _rejecting(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        async def reject(_request: object, context: grpc.aio.ServicerContext) -> None:
            self.stats.rejected_total += 1
            self.warn_refused(context.peer(), method)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)

        serde = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(reject, **serde)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(reject, **serde)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(reject, **serde)
        return grpc.unary_unary_rpc_method_handler(reject, **serde)

    def warn_refused(self, peer: str | None, method: str) -> None:
        """At most one warning per peer host per minute (``core.tokens.refusal_log``)."""
        host = peer_host(peer or "?")
        self._refusals.report(
            host,
            "gRPC call refused: no valid bearer token (UNAUTHENTICATED); further refusals "
            "from this peer are counted, not logged, for 60 s",
            {"peer": host, "method": method, "rejected_total": self.stats.rejected_total},
        )


class ThreadedBearerTokenInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """``BearerTokenInterceptor``'s rule for a synchronous (threaded) server: the same
    check, counters and rate-limited log (it uses ``inner``'s), a rejecting handler that
    aborts UNAUTHENTICATED before the servicer runs. The rejecting handler is unary-unary:
    the only kind served on such a server (ext_authz's ``Check``)."""

    def __init__(self, inner: BearerTokenInterceptor) -> None:
        self._inner = inner

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        if handler is None or self._inner.allowed(details):
            return handler
        method = details.method

        def reject(_request: object, context: grpc.ServicerContext) -> None:
            self._inner.stats.rejected_total += 1
            self._inner.warn_refused(context.peer(), method)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)

        return grpc.unary_unary_rpc_method_handler(
            reject,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _check_unix_socket_free(path: str) -> None:
    """Refuse a socket path another process is serving on (a stale file is fine)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return  # absent, or a stale file nobody listens on: gRPC replaces it
    raise _bind_error(f"unix:{path}")


def _bind_error(bind: str, *, tls: bool = False) -> GrpcBindError:
    tls_hint = ", or server.tls cert/key/client_ca are not valid PEM" if tls else ""
    return GrpcBindError(
        errno.EADDRINUSE,
        f"gRPC server cannot bind {bind}: address already in use (another llm-health?) "
        f"or not permitted{tls_hint}",
    )
