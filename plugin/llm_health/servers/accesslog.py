"""gRPC adapter for ``envoy.service.accesslog.v3.AccessLogService``: one method.

The stream is consumed by ``llm_health.traffic.stream.LogStreams``; bytes that are not an
access-log message end the call with INVALID_ARGUMENT (``servers.decoding``). Envoy's
gRPC access logger expects no answer until it closes the stream; an empty
``StreamAccessLogsResponse`` is the documented reply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from google.protobuf.message import DecodeError

from llm_health.servers.decoding import rejecting_undecodable
from llm_health.traffic.stream import LogStreams


class AccessLogServicer:
    def __init__(self, streams: LogStreams) -> None:
        self._streams = streams

    async def StreamAccessLogs(
        self,
        requests: AsyncIterator[als_pb2.StreamAccessLogsMessage],
        context: grpc.aio.ServicerContext,
    ) -> als_pb2.StreamAccessLogsResponse:
        try:
            await self._streams.consume(requests, context.peer())
        except DecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)[:200])
        return als_pb2.StreamAccessLogsResponse()


def add_access_log_servicer(server: grpc.aio.Server, streams: LogStreams) -> None:
    """Register the access-log service on ``server`` (before it starts)."""
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(
        AccessLogServicer(streams), rejecting_undecodable(server)
    )
