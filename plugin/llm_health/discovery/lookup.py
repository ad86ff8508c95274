"""DNS queries for discovery, through dnspython's asyncio resolver, on a thread of their own.

No cache of our own or dnspython's (``Resolver.cache`` stays None): every resolution asks
the server, and the records' TTL paces the next one (``answers.next_refresh``). A
truncated UDP answer (hundreds of pods) is retried over TCP by dnspython itself.

The answer is the server's, and so is its size: a TCP answer holds up to 64 KiB, some
4,000 addresses, which dnspython takes about half a second to decode (59 ms for 500,
docs/benchmarks.md). So the queries, their decoding and ``endpoints_from`` run on one
thread with its own event loop (``_DnsThread``): the plugin's loop, which times probes
and answers /livez, only waits, and competes with that one thread for the GIL. The CPU
that thread spent during a resolution is its ``Found.cost_s``, which paces the next one
(``answers.next_refresh``). An SRV answer's targets that came without addresses are
looked up MAX_TARGET_LOOKUPS at most per resolution (the others are left out, and
said). So no server can make a resolution cost without bound (docs/design.md §10, §11.2).

Every dnspython error is mapped to a ``DnsFault`` here, so the watcher sees one exception
type; a partial answer (A answered, AAAA timed out) is a fault too: taking it would drop
every address of the family that did not answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

import dns.asyncresolver
import dns.exception
import dns.message
import dns.name
import dns.nameserver
import dns.rdatatype
import dns.resolver
import dns.rrset

from llm_health.discovery.answers import DnsFault, FaultKind, Found, Record, endpoints_from
from llm_health.discovery.settings import DiscoveryConfig, DnsConfig

WHOLE_BUDGET = 3  # x dns.timeout for an A + AAAA resolution
MAX_PARALLEL_TARGETS = 16  # SRV targets resolved at once (no stampede on the DNS server)
MAX_TARGET_LOOKUPS = 32  # SRV targets without addresses along, looked up per resolution
UDP_RECORDS = 25  # more A records than fit in a 512-byte UDP answer: ask over TCP
_ADDRESS_TYPES = (dns.rdatatype.A, dns.rdatatype.AAAA)
T = TypeVar("T")


class DnsLookup:
    """Resolves discovery names with ``settings``' servers (or the system's resolv.conf)."""

    def __init__(self, settings: DnsConfig) -> None:
        self.settings = settings
        self._resolver: dns.asyncresolver.Resolver | None = None
        self._big: set[tuple[str, dns.rdatatype.RdataType]] = set()
        self._last: dict[DiscoveryConfig, tuple[tuple[Record, ...], tuple[str, ...], Found]] = {}

    async def resolve(self, discovery: DiscoveryConfig) -> Found:
        """The endpoint set ``discovery`` names now. DnsFault: keep the last known set.
        Every step is bounded (``_within``): a server that answers slowly, or target by
        target, cannot hold the cluster's discovery for minutes."""
        started = _DNS.cpu_s()
        notes: list[str] = []
        answer = tuple(await self._records(discovery, notes))
        last = self._last.get(discovery)
        if last is not None and last[:2] == (answer, tuple(notes)):
            found = last[2]  # the same records as last time: the same set, not rebuilt
        else:
            built = await _DNS.call(
                endpoints_from, answer, discovery.weight, discovery.max_endpoints
            )
            found = dataclasses.replace(built, dropped=(*notes, *built.dropped))
            self._last[discovery] = (answer, tuple(notes), found)
        return dataclasses.replace(found, cost_s=_DNS.cpu_s() - started)

    async def _records(self, discovery: DiscoveryConfig, notes: list[str]) -> list[Record]:
        if discovery.kind == "srv":
            return await self._srv_records(discovery.name, discovery.max_endpoints, notes)
        assert discovery.port is not None  # the config requires it for dns:
        port = discovery.port
        return await self._within(
            WHOLE_BUDGET, discovery.name, self._address_records(discovery.name, port)
        )

    async def _within(self, timeouts: float, name: str, work: Awaitable[T]) -> T:
        """``work`` within ``timeouts`` x dns.timeout, else a TIMEOUT fault."""
        budget = self.settings.timeout * timeouts
        try:
            async with asyncio.timeout(budget):
                return await work
        except TimeoutError:
            raise DnsFault(
                FaultKind.TIMEOUT, f"{name}: no complete answer in {budget:g} s"
            ) from None

    # --- A / AAAA ---------------------------------------------------------------------

    async def _address_records(self, name: str, port: int) -> list[Record]:
        answers = await asyncio.gather(
            *(self._query(name, rdtype) for rdtype in _ADDRESS_TYPES), return_exceptions=True
        )
        records: list[Record] = []
        missing = 0
        for answer in answers:
            if isinstance(answer, dns.resolver.NoAnswer):
                missing += 1  # the name exists, this family has no record: not a fault
            elif isinstance(answer, BaseException):
                raise _fault(answer, name)
            else:
                records.extend(_records(answer.rrset, port))
        if missing == len(_ADDRESS_TYPES):
            raise DnsFault(FaultKind.EMPTY, f"{name}: no A or AAAA record")
        return records

    # --- SRV --------------------------------------------------------------------------

    async def _srv_records(self, name: str, limit: int, notes: list[str]) -> list[Record]:
        try:
            answer = await self._query(name, dns.rdatatype.SRV)
        except dns.resolver.NoAnswer:
            raise DnsFault(FaultKind.EMPTY, f"{name}: no SRV record") from None
        except Exception as exc:
            raise _fault(exc, name) from None
        assert answer.rrset is not None
        glue = _glue(answer.response)
        targets = [
            (rdata.target, rdata.port, answer.rrset.ttl)
            for rdata in answer.rrset
            if rdata.target != dns.name.root  # RFC 2782: "." = service not available here
        ][:limit]
        targets = _lookups_bounded(targets, glue, notes)
        gate = asyncio.Semaphore(MAX_PARALLEL_TARGETS)

        async def addresses(target: dns.name.Name, port: int, ttl: int) -> list[Record]:
            known = glue.get(target)
            if known:
                return [Record(ip, port, min(ttl, t)) for ip, t in known]
            async with gate:
                found = await self._address_records(target.to_text(), port)
            return [Record(r.ip, r.port, min(ttl, r.ttl)) for r in found]

        # Targets without glue need their own queries, MAX_PARALLEL_TARGETS at a time: the
        # budget grows with their number (the server's glue makes it one round trip).
        rounds = 1 + math.ceil(sum(t[0] not in glue for t in targets) / MAX_PARALLEL_TARGETS)
        results = await self._within(
            rounds + 1,
            name,
            asyncio.gather(*(addresses(*target) for target in targets), return_exceptions=True),
        )
        records: list[Record] = []
        for result in results:
            if isinstance(result, DnsFault) and result.kind in (
                FaultKind.NXDOMAIN,
                FaultKind.EMPTY,
            ):
                continue  # a target without address: that target only is left out
            if isinstance(result, BaseException):
                raise _fault(result, name)
            records.extend(result)
        if not records:
            raise DnsFault(FaultKind.EMPTY, f"{name}: no SRV target has an address")
        return records

    # --- the resolver -------------------------------------------------------------------

    async def _query(self, name: str, rdtype: dns.rdatatype.RdataType) -> dns.resolver.Answer:
        # An answer too large for 512 bytes of UDP comes back truncated and is asked again
        # over TCP; a name that needed TCP last time is asked over TCP at once.
        big = (name, rdtype) in self._big
        answer = await _DNS.run(
            self._get_resolver().resolve(
                name, rdtype, lifetime=self.settings.timeout, search=None, tcp=big
            )
        )
        if answer.rrset is not None and len(answer.rrset) > UDP_RECORDS:
            self._big.add((name, rdtype))
        else:
            self._big.discard((name, rdtype))
        return answer

    def _get_resolver(self) -> dns.asyncresolver.Resolver:
        if self._resolver is None:
            self._resolver = _new_resolver(self.settings)
        return self._resolver


class _DnsThread:
    """A daemon thread running an event loop of its own, started at the first query:
    every query (with dnspython's decoding of the answer) runs there. Cancelling the
    caller's await cancels the query."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: int | None = None

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._started()))

    async def call(self, work: Callable[..., T], *args: Any) -> T:
        async def call() -> T:
            return work(*args)

        return await self.run(call())

    def cpu_s(self) -> float:
        """CPU seconds the thread has used (0 where the platform cannot say)."""
        if self._clock is None:
            return 0.0
        return time.clock_gettime(self._clock)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="dns", daemon=True)
                thread.start()
                assert thread.ident is not None
                if hasattr(time, "pthread_getcpuclockid"):
                    self._clock = time.pthread_getcpuclockid(thread.ident)
                self._loop = loop
            return self._loop


_DNS = _DnsThread()


def _lookups_bounded(
    targets: list[tuple[dns.name.Name, int, int]],
    glue: dict[dns.name.Name, list[tuple[str, int]]],
    notes: list[str],
) -> list[tuple[dns.name.Name, int, int]]:
    """The targets to take: every one with addresses along, and of the others (each costs
    an A and an AAAA query) the first MAX_TARGET_LOOKUPS by name, a stable choice
    whatever order the server sends; the rest are left out, said in ``notes``."""
    bare = sorted((t for t in targets if t[0] not in glue), key=lambda t: t[0].to_text())
    if len(bare) <= MAX_TARGET_LOOKUPS:
        return targets
    notes.append(
        f"{len(bare)} SRV targets came without addresses: looked up the first "
        f"{MAX_TARGET_LOOKUPS} (by name), the other {len(bare) - MAX_TARGET_LOOKUPS} left out"
    )
    taken = set(bare[:MAX_TARGET_LOOKUPS])
    return [t for t in targets if t[0] in glue or t in taken]


def _new_resolver(settings: DnsConfig) -> dns.asyncresolver.Resolver:
    if settings.nameservers:
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [
            dns.nameserver.Do53Nameserver(ip, port) for ip, port in settings.servers()
        ]
    else:
        try:
            resolver = dns.asyncresolver.Resolver()  # /etc/resolv.conf: servers, search
        except dns.resolver.NoResolverConfiguration:
            raise DnsFault(
                FaultKind.SERVFAIL, "no nameserver: /etc/resolv.conf has none; set dns.nameservers"
            ) from None
    resolver.timeout = settings.timeout  # per server attempt
    resolver.lifetime = settings.timeout  # the whole resolution
    resolver.cache = None
    return resolver


def _records(rrset: dns.rrset.RRset | None, port: int) -> Iterator[Record]:
    if rrset is None:
        return
    for rdata in rrset:
        yield Record(rdata.address, port, rrset.ttl)


def _glue(response: dns.message.Message) -> dict[dns.name.Name, list[tuple[str, int]]]:
    """Addresses of SRV targets that the server sent along (the additional section:
    CoreDNS does for headless Services), so no second query is needed."""
    glue: dict[dns.name.Name, list[tuple[str, int]]] = {}
    rrsets: Iterable[dns.rrset.RRset] = response.additional
    for rrset in rrsets:
        if rrset.rdtype in _ADDRESS_TYPES:
            glue.setdefault(rrset.name, []).extend((r.address, rrset.ttl) for r in rrset)
    return glue


def _fault(exc: BaseException, name: str) -> DnsFault:
    """A dnspython (or socket) error as a DnsFault, its text bounded and printable. Any
    other error (a malformed message: FormError, a dnspython bug) is a bad answer."""
    if isinstance(exc, DnsFault):
        return exc
    if isinstance(exc, dns.resolver.NXDOMAIN):
        return DnsFault(FaultKind.NXDOMAIN, f"{name}: no such name (NXDOMAIN)")
    if isinstance(exc, dns.exception.Timeout):
        return DnsFault(FaultKind.TIMEOUT, f"{name}: no answer in time")
    if isinstance(exc, dns.resolver.NoNameservers):
        return DnsFault(FaultKind.SERVFAIL, f"{name}: every server failed (SERVFAIL/REFUSED)")
    if isinstance(exc, OSError):
        return DnsFault(FaultKind.SERVFAIL, f"{name}: cannot reach the server ({exc.strerror})")
    return DnsFault(FaultKind.BAD_ANSWER, f"{name}: {type(exc).__name__}")
