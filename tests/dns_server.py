"""A real DNS server on loopback for the discovery tests and benchmarks: dnslib's
``DNSServer`` (UDP and TCP on one port, in threads), answering from records the test
changes while the plugin runs.

- ``set_a(name, ips, ttl=0)``, ``set_srv(name, [(target, port)], ttl=0, glue=True)``:
  replace records (SRV answers carry the targets' addresses, like CoreDNS);
- ``mode``: "ok" (answer), "servfail", "refused", "nxdomain" (every name), "drop" (no
  answer at all: the client times out);
- unknown names: NXDOMAIN; a known name without the asked type: NOERROR, no answer.

UDP answers larger than ``UDP_LIMIT`` bytes are truncated (TC bit), as a real server
does, so a large answer makes the client retry over TCP. Use as a context manager: the
threads stop on exit.

``dns_process()`` runs the same server in a child process (same methods, plus
``queries_of(qtype)``), for tests that time the plugin while the server answers
thousands of queries: in the test's own process its threads would share the GIL with
whatever the test measures.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer

UDP_LIMIT = 1232  # the EDNS payload size DNS Flag Day 2020 recommends
_RCODES = {"servfail": RCODE.SERVFAIL, "refused": RCODE.REFUSED, "nxdomain": RCODE.NXDOMAIN}


class _Records(BaseResolver):  # type: ignore[misc]
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.a: dict[str, tuple[list[str], int]] = {}
        self.srv: dict[str, tuple[list[tuple[str, int]], int, bool]] = {}
        self.mode = "ok"
        self.queries = 0
        self.by_type: Counter[str] = Counter()

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        qtype = QTYPE[request.q.qtype]
        with self.lock:
            self.queries += 1
            self.by_type[qtype] += 1
            mode = self.mode
            addresses = self.a.get(name)
            services = self.srv.get(name)
        if mode in _RCODES:
            reply.header.rcode = _RCODES[mode]
            return reply
        if addresses is None and services is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        if qtype in ("A", "AAAA") and addresses is not None:
            ips, ttl = addresses
            for ip in ips:
                v6 = ":" in ip
                if (qtype == "AAAA") == v6:
                    record = AAAA(ip) if v6 else A(ip)
                    reply.add_answer(RR(request.q.qname, request.q.qtype, rdata=record, ttl=ttl))
        if qtype == "SRV" and services is not None:
            targets, ttl, glue = services
            for target, port in targets:
                rdata = SRV(priority=0, weight=10, port=port, target=target)
                reply.add_answer(RR(request.q.qname, QTYPE.SRV, rdata=rdata, ttl=ttl))
                known = self.a.get(target.rstrip(".").lower()) if glue else None
                for ip in known[0] if known else ():
                    record = AAAA(ip) if ":" in ip else A(ip)
                    kind = QTYPE.AAAA if ":" in ip else QTYPE.A
                    reply.add_ar(RR(target, kind, rdata=record, ttl=known[1] if known else 0))
        return reply


class _Handler(DNSHandler):  # type: ignore[misc]
    def handle(self) -> None:
        if self.server.resolver.mode == "drop":
            return  # no answer: the client's timeout runs out
        super().handle()

    def get_reply(self, data: bytes) -> bytes:
        request = DNSRecord.parse(data)
        reply = self.server.resolver.resolve(request, self)
        packed: bytes = reply.pack()
        if self.protocol == "udp" and len(packed) > UDP_LIMIT:
            # A real server's truncated answer keeps the question (dnslib's truncate()
            # drops it, and a resolver then ignores the answer as not matching).
            cut = request.reply()
            cut.header.tc = 1
            packed = cut.pack()
        return packed


class _QuietLogger(DNSLogger):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__(log="-request,-reply,-truncated,-recv,-send,-data", prefix=False)


class LoopbackDns:
    """The server's state; ``port`` is where it answers on 127.0.0.1 (UDP and TCP)."""

    def __init__(self, records: _Records, port: int) -> None:
        self._records = records
        self.port = port

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def queries(self) -> int:
        with self._records.lock:
            return self._records.queries

    def queries_of(self, qtype: str) -> int:
        with self._records.lock:
            return self._records.by_type[qtype]

    def set_mode(self, mode: str) -> None:
        assert mode in ("ok", "servfail", "refused", "nxdomain", "drop"), mode
        with self._records.lock:
            self._records.mode = mode

    def set_a(self, name: str, ips: Iterable[str], ttl: int = 0) -> None:
        with self._records.lock:
            self._records.a[name.lower()] = (list(ips), ttl)

    def set_srv(
        self, name: str, targets: Iterable[tuple[str, int]], ttl: int = 0, glue: bool = True
    ) -> None:
        """SRV records; ``glue``: the targets' known addresses go in the additional
        section, as CoreDNS does for a headless Service (False: the client asks)."""
        with self._records.lock:
            self._records.srv[name.lower()] = (list(targets), ttl, glue)

    def remove(self, name: str) -> None:
        with self._records.lock:
            self._records.a.pop(name.lower(), None)
            self._records.srv.pop(name.lower(), None)


@contextmanager
def loopback_dns() -> Iterator[LoopbackDns]:
    """Start the server (UDP and TCP on the same free port); stop both on exit."""
    records = _Records()
    udp, tcp = _start_pair(records)
    try:
        yield LoopbackDns(records, udp.server.server_address[1])
    finally:
        for server in (udp, tcp):
            server.stop()
            server.server.server_close()


def _start_pair(records: _Records) -> tuple[DNSServer, DNSServer]:
    logger = _QuietLogger()
    for _attempt in range(20):
        udp = DNSServer(records, "127.0.0.1", 0, logger=logger, handler=_Handler)
        port = udp.server.server_address[1]
        try:
            tcp = DNSServer(records, "127.0.0.1", port, tcp=True, logger=logger, handler=_Handler)
        except OSError:
            udp.server.server_close()
            continue  # the TCP side of that port is taken: pick another
        udp.start_thread()
        tcp.start_thread()
        return udp, tcp
    raise RuntimeError("no free port for the DNS server")


class DnsProcess:
    """``loopback_dns()`` in a child process; every LoopbackDns method is called over a
    pipe (``call``), the common ones have their own names."""

    def __init__(self, conn: Connection, process: Any, port: int) -> None:
        self._conn, self._process, self.port = conn, process, port

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def call(self, method: str, *args: Any) -> Any:
        self._conn.send((method, args))
        return self._conn.recv()

    def set_a(self, name: str, ips: Iterable[str], ttl: int = 0) -> None:
        self.call("set_a", name, list(ips), ttl)

    def set_srv(
        self, name: str, targets: Iterable[tuple[str, int]], ttl: int = 0, glue: bool = True
    ) -> None:
        self.call("set_srv", name, list(targets), ttl, glue)

    def queries_of(self, qtype: str) -> int:
        count: int = self.call("queries_of", qtype)
        return count


@contextmanager
def dns_process() -> Iterator[DnsProcess]:
    """The server in a child process (spawned: no thread of the test is copied)."""
    context = multiprocessing.get_context("spawn")
    conn, child = context.Pipe()
    process = context.Process(target=_serve, args=(child,), daemon=True)
    process.start()
    try:
        if not conn.poll(30):
            raise RuntimeError("the DNS server process did not start")
        yield DnsProcess(conn, process, conn.recv())
    finally:
        conn.send(None)
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join()


def _serve(conn: Connection) -> None:
    """The child: serve, and run each (method, args) sent until None."""
    with loopback_dns() as server:
        conn.send(server.port)
        while (request := conn.recv()) is not None:
            method, args = request
            conn.send(getattr(server, method)(*args))
