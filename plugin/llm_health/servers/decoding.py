"""Undecodable requests answer INVALID_ARGUMENT, with one short warning and no traceback.

grpc's generated ``add_*Servicer_to_server`` registers ``Message.FromString`` as the
request deserializer. When it raises (bytes that are not that message), grpc.aio logs
"Unexpected [DecodeError] raised by servicer method" with a traceback at ERROR and
answers UNKNOWN. ``rejecting_undecodable(server)`` stands in for the server while the
generated code registers its handlers and changes each one:

- the deserializer never raises: bytes it cannot parse become an ``Undecodable`` marker;
- a unary request that is ``Undecodable`` is answered INVALID_ARGUMENT before the method
  runs;
- in a request stream, an ``Undecodable`` message raises ``UndecodableRequest`` (a
  protobuf ``DecodeError``, so engines that already handle one, like HDS's, keep doing so)
  and the call ends with INVALID_ARGUMENT unless the method answered it itself.

The warning names the method and the peer's address and is logged at most once per peer
host per ``REPEAT_LOG_S`` (``core.problems``: one table for the process, bounded).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from llm_health.core.problems import ProblemLog, peer_host
from llm_health.model.redact import printable

REPEAT_LOG_S = 60.0
MAX_PEERS = 1024  # peer hosts remembered for the rate limit (bounded memory)
INVALID_MESSAGE = "request is not a valid message"
_LOG = logging.getLogger("llm_health.grpc")


class Undecodable:
    """What the lenient deserializer returns for bytes it cannot parse."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


class UndecodableRequest(DecodeError):
    """A message of a request stream could not be decoded."""


def rejecting_undecodable(server: Any) -> Any:
    """A stand-in for ``server`` (a ``grpc.aio.Server`` or another stand-in) to pass to a
    generated ``add_*Servicer_to_server``: the handlers it registers reject undecodable
    requests with INVALID_ARGUMENT."""
    return _LenientServer(server)


class _LenientServer:
    def __init__(self, server: Any) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: tuple[Any, ...]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_LenientHandler(h) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        lenient = {name: lenient_handler(h, f"/{service}/{name}") for name, h in handlers.items()}
        self._server.add_registered_method_handlers(service, lenient)


class _LenientHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        handler = self._inner.service(details)
        return None if handler is None else lenient_handler(handler, str(details.method))


def lenient_handler(handler: Any, method: str) -> Any:
    """``handler`` (a ``grpc.RpcMethodHandler``) with a deserializer that never raises and
    a behaviour that answers undecodable requests with INVALID_ARGUMENT."""
    decode = handler.request_deserializer
    if decode is None or getattr(decode, "lenient", False):
        return handler
    changed: dict[str, Any] = {"request_deserializer": _lenient(decode)}
    if handler.unary_unary is not None and not inspect.iscoroutinefunction(handler.unary_unary):
        changed["unary_unary"] = _threaded_unary_unary(handler.unary_unary, method)
    elif handler.unary_unary is not None:
        changed["unary_unary"] = _unary_unary(handler.unary_unary, method)
    elif handler.unary_stream is not None:
        changed["unary_stream"] = _unary_stream(handler.unary_stream, method)
    elif handler.stream_unary is not None:
        changed["stream_unary"] = _stream_unary(handler.stream_unary, method)
    elif handler.stream_stream is not None:
        changed["stream_stream"] = _stream_stream(handler.stream_stream, method)
    return handler._replace(**changed)


def _lenient(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def lenient(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception:  # DecodeError, or anything else a parser may raise on bytes
            return Undecodable(len(data))

    lenient.lenient = True  # type: ignore[attr-defined]
    return lenient


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            raise UndecodableRequest(f"a message of {request.size} bytes is not decodable")
        yield request


def _unary_unary(method: Callable[..., Awaitable[Any]], name: str) -> Callable[..., Any]:
    async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await _reject(context, name)
        return await method(request, context)

    return behaviour


def _threaded_unary_unary(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    """The same for a synchronous (threaded) server's unary method."""

    def behaviour(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            _log_undecodable(context.peer() or "?", name)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, INVALID_MESSAGE)
        return method(request, context)

    return behaviour


def _unary_stream(method: Callable[..., AsyncIterator[Any]], name: str) -> Callable[..., Any]:
    async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Undecodable):
            await _reject(context, name)
        async for response in method(request, context):
            yield response

    return behaviour


def _stream_unary(method: Callable[..., Awaitable[Any]], name: str) -> Callable[..., Any]:
    async def behaviour(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(_checked(requests), context)
        except UndecodableRequest:
            await _reject(context, name)

    return behaviour


def _stream_stream(method: Callable[..., AsyncIterator[Any]], name: str) -> Callable[..., Any]:
    async def behaviour(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        try:
            async for response in method(_checked(requests), context):
                yield response
        except UndecodableRequest:
            await _reject(context, name)

    return behaviour


# One for every server of the process (threaded ones too: ProblemLog takes a lock).
_UNDECODABLE = ProblemLog(_LOG, every_s=REPEAT_LOG_S, max_keys=MAX_PEERS)


async def _reject(context: grpc.aio.ServicerContext, method: str) -> NoReturn:
    _log_undecodable(context.peer() or "?", method)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, INVALID_MESSAGE)
    raise AssertionError("unreachable: abort raises")


def _log_undecodable(peer_text: str, method: str) -> None:
    peer = _host(peer_text)
    _UNDECODABLE.report(
        peer,
        "undecodable request to %s from %s: answered INVALID_ARGUMENT "
        "(logged at most every %g s per peer)",
        args=(method, peer, REPEAT_LOG_S),
    )


def _host(peer: str) -> str:
    """The peer host (the rate limit is per host, not per connection); printable and
    bounded, it is the peer's text."""
    return printable(peer_host(peer), 100)
