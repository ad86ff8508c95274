"""HDS peers cannot make the log grow without bound (docs/design.md §10), over real gRPC
on loopback, in process:

- 30 streams identifying with a 1 MB node id (with no capability, re-identifying under
  another id, reporting without an xDS stream): the node id is clipped in every line, and
  all of it logs less than MAX_LOG_BYTES;
- 2,000 streams opened and closed (a new node id each): the "HDS stream open" and "HDS
  stream closed" lines are rate-limited, with a count of those left out.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from envoy.service.health.v3 import hds_pb2, hds_pb2_grpc

from llm_health.hds.service import HdsService
from llm_health.hds.settings import HdsConfig
from llm_health.ops.logging_setup import JsonFormatter
from llm_health.servers.grpc import start_grpc_server
from llm_health.servers.hds import add_hds_servicer
from tests.integration.test_hds_grpc import ENDPOINTS, Stream, hello, report
from tests.polling import wait_until_async

pytestmark = pytest.mark.timeout(120)

NODE_BYTES = 1_000_000
LONG_STREAMS = 30
MAX_LOG_BYTES = 64 * 1024  # for all 30 streams: the node ids alone would be 30 MB
CHURN = 2_000
RECV_S = 30.0  # a node id of 1 MB takes a while to hash (hds/assign.py)
CHURN_BATCH = 50
MAX_CHURN_LINES = 20  # for all 2,000 streams (was 2 per stream)


class CountingLog:
    """The llm_health log at INFO as the service writes it (JSON lines), in memory."""

    def __init__(self) -> None:
        self.out = io.StringIO()
        self.handler = logging.StreamHandler(self.out)
        self.handler.setFormatter(JsonFormatter())

    @property
    def bytes(self) -> int:
        return len(self.out.getvalue().encode())

    def lines(self) -> list[str]:
        return self.out.getvalue().splitlines()


@pytest.fixture
def counted() -> Iterator[CountingLog]:
    log = CountingLog()
    logger = logging.getLogger("llm_health")
    level = logger.level
    logger.addHandler(log.handler)
    logger.setLevel(logging.INFO)
    try:
        yield log
    finally:
        logger.removeHandler(log.handler)
        logger.setLevel(level)


@pytest.fixture
async def channel() -> AsyncIterator[tuple[HdsService, grpc.aio.Channel]]:
    # No node holds an xDS stream: reports are ignored (and logged once per node).
    service = HdsService(HdsConfig(), endpoints=ENDPOINTS, xds_open=lambda _node: False)
    server, port = await start_grpc_server("127.0.0.1:0")
    add_hds_servicer(server, service)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as opened:
            yield service, opened
    finally:
        await server.stop(0)


def stream_on(opened: grpc.aio.Channel) -> Stream:
    return Stream(hds_pb2_grpc.HealthDiscoveryServiceStub(opened).StreamHealthCheck)


def long_id(index: int) -> str:
    # Printable, and a newline and an ANSI escape too: one line each, escaped.
    return f"gw-{index}-\n\x1b[31m" + "x" * NODE_BYTES


async def one_long_stream(opened: grpc.aio.Channel, index: int) -> None:
    stream = stream_on(opened)
    kind = index % 3
    if kind == 0:
        stream.send(hello(long_id(index)))
        await stream.recv(RECV_S)
        stream.send(report())  # no xDS stream with this id: ignored and logged
        stream.send(hello(long_id(index)))  # answered once the report was read
        await stream.recv(RECV_S)
    elif kind == 1:
        stream.send(hello(long_id(index), hds_pb2.Capability.REDIS))  # cannot run tcp checks
        await stream.recv(RECV_S)
    else:
        stream.send(hello(long_id(index)))
        await stream.recv(RECV_S)
        stream.send(hello(long_id(index + 1000)))  # another id on the same stream
        await stream.recv(RECV_S)
    await stream.close()


async def test_thirty_streams_with_a_1_mb_node_id_log_little(
    channel: tuple[HdsService, grpc.aio.Channel], counted: CountingLog
) -> None:
    service, opened = channel
    await asyncio.gather(*(one_long_stream(opened, i) for i in range(LONG_STREAMS)))
    await wait_until_async(
        lambda: service.stats.streams_total == LONG_STREAMS and service.stats.streams_open == 0,
        10,
        "every stream closed",
    )
    assert service.stats.reports_without_xds == LONG_STREAMS // 3
    assert counted.bytes < MAX_LOG_BYTES, (counted.bytes, counted.lines()[:3])
    assert all(len(line) < 2_000 for line in counted.lines())
    assert "\x1b" not in counted.out.getvalue()


async def churned(opened: grpc.aio.Channel, index: int) -> None:
    stream = stream_on(opened)
    stream.send(hello(f"churn-{index}"))
    await stream.recv()
    await stream.close()


async def test_two_thousand_churned_streams_log_a_bounded_number_of_lines(
    channel: tuple[HdsService, grpc.aio.Channel], counted: CountingLog
) -> None:
    service, opened = channel
    for start in range(0, CHURN, CHURN_BATCH):
        await asyncio.gather(*(churned(opened, i) for i in range(start, start + CHURN_BATCH)))
    await wait_until_async(
        lambda: service.stats.streams_total == CHURN and service.stats.streams_open == 0,
        10,
        "every stream closed",
    )
    lines = counted.lines()
    assert len(lines) <= MAX_CHURN_LINES, (len(lines), lines[:5])
    assert any('"HDS stream open"' in line for line in lines)
    assert any('"HDS stream closed"' in line for line in lines)
