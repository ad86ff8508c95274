"""What ``clusters[].discovery`` and ``dns:`` configure, in domain form (no pydantic).

Built by ``llm_health.config`` (``DiscoveryConfig.to_settings``, ``DnsConfig.to_settings``).
Units are in the names (``_s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RecordKind = Literal["dns", "srv"]  # "dns": A + AAAA of the name, one port; "srv": SRV


@dataclass(frozen=True, slots=True)
class DiscoverySettings:
    """One cluster's discovery.

    - ``name``: the DNS name (``dns:`` or ``srv:`` in the file);
    - ``port``: every address's port for ``kind == "dns"``; None for SRV (ports come from
      the records);
    - ``refresh_s``: the floor between two resolutions (a record's TTL may ask for a
      slower pace, never a faster one: ``answers.next_refresh``);
    - ``weight``: the load-balancing weight of every discovered endpoint;
    - ``max_endpoints``: at most this many addresses are taken from one answer (a DNS
      server is a peer: it must not be able to make us probe without bound).
    """

    cluster: str
    name: str
    kind: RecordKind = "dns"
    port: int | None = None
    refresh_s: float = 5.0
    weight: int = 100
    max_endpoints: int = 1000


@dataclass(frozen=True, slots=True)
class DnsSettings:
    """``dns:``: ``nameservers`` as (ip, port); empty: the system's resolv.conf.
    ``timeout_s``: one resolution's whole budget (every server and retry included)."""

    nameservers: tuple[tuple[str, int], ...] = ()
    timeout_s: float = 2.0
