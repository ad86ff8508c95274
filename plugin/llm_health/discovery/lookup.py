"""DNS queries for discovery, through dnspython's asyncio resolver.

No cache of our own or dnspython's (``Resolver.cache`` stays None): every resolution asks
the server, and the records' TTL paces the next one (``answers.next_refresh``). A
truncated UDP answer (hundreds of pods) is retried over TCP by dnspython itself.

Every dnspython error is mapped to a ``DnsFault`` here, so the watcher sees one exception
type; a partial answer (A answered, AAAA timed out) is a fault too: taking it would drop
every address of the family that did not answer.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Iterable, Iterator
from typing import TypeVar

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
MAX_PARALLEL_TARGETS = 16
UDP_RECORDS = 25  # more A records than fit in a 512-byte UDP answer: ask over TCP  # SRV targets resolved at once (no stampede on the DNS server)
_ADDRESS_TYPES = (dns.rdatatype.A, dns.rdatatype.AAAA)
T = TypeVar("T")


class DnsLookup:
    """Resolves discovery names with ``settings``' servers (or the system's resolv.conf)."""

    def __init__(self, settings: DnsConfig) -> None:
        self.settings = settings
        self._resolver: dns.asyncresolver.Resolver | None = None
        self._big: set[tuple[str, dns.rdatatype.RdataType]] = set()
        self._last: dict[DiscoveryConfig, tuple[tuple[Record, ...], Found]] = {}

    async def resolve(self, discovery: DiscoveryConfig) -> Found:
        """The endpoint set ``discovery`` names now. DnsFault: keep the last known set.
        Every step is bounded (``_within``): a server that answers slowly, or target by
        target, cannot hold the cluster's discovery for minutes."""
        answer = tuple(await self._records(discovery))
        last = self._last.get(discovery)
        if last is not None and last[0] == answer:
            return last[1]  # the same records as last time: the same set, not rebuilt
        found = endpoints_from(answer, discovery.weight, discovery.max_endpoints)
        self._last[discovery] = (answer, found)
        return found

    async def _records(self, discovery: DiscoveryConfig) -> list[Record]:
        if discovery.kind == "srv":
            return await self._srv_records(discovery.name, discovery.max_endpoints)
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

    async def _srv_records(self, name: str, limit: int) -> list[Record]:
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
        answer = await self._get_resolver().resolve(
            name, rdtype, lifetime=self.settings.timeout, search=None, tcp=big
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
