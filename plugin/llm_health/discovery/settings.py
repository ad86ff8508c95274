"""What ``clusters[].discovery`` and ``dns:`` configure (docs/design.md §11): the config
sections themselves, the types the watcher and the resolver receive.

A ``discovery:`` section sits under its cluster and does not carry the cluster's name:
``config.Config.discoveries`` pairs the two (cluster name -> section).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from llm_health.core.addresses import is_host_name, is_service_name, split_nameserver
from llm_health.core.settings import Duration, Frozen, Int

RecordKind = Literal["dns", "srv"]  # "dns": A + AAAA of the name, one port; "srv": SRV


class DiscoveryConfig(Frozen):
    """``clusters[].discovery``: endpoints from DNS (docs/design.md §11). Exactly one of
    ``dns`` (A and AAAA records of a name, every address on ``port``) and ``srv`` (SRV
    records: each target's addresses on the record's port).

    - ``refresh``: the floor between two resolutions (a record's TTL may ask for a slower
      pace, never a faster one: ``answers.next_refresh``);
    - ``weight``: the load-balancing weight of every discovered endpoint;
    - ``max_endpoints``: at most this many addresses are taken from one answer (a DNS
      server is a peer: it must not be able to make us probe without bound).
    """

    dns: str | None = Field(None, max_length=253)
    srv: str | None = Field(None, max_length=253)
    port: Int | None = Field(None, ge=1, le=65535)
    refresh: Duration = Field(5.0, ge=0.5, le=3600.0)
    weight: Int = Field(100, ge=1, le=1_000_000)
    max_endpoints: Int = Field(1000, ge=1, le=10_000)

    @field_validator("dns")
    @classmethod
    def _host_name(cls, value: str | None) -> str | None:
        if value is not None and not is_host_name(value):
            raise ValueError(f'"{value}" is not a DNS name (letters, digits, "-", dots)')
        return value

    @field_validator("srv")
    @classmethod
    def _service_name(cls, value: str | None) -> str | None:
        if value is not None and not is_service_name(value):
            raise ValueError(f'"{value}" is not an SRV name (e.g. "_http._tcp.svc.example")')
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DiscoveryConfig:
        if (self.dns is None) == (self.srv is None):
            raise ValueError("set exactly one of dns (with port) and srv")
        if self.dns is not None and self.port is None:
            raise ValueError("dns discovery needs a port: every address is an endpoint on it")
        if self.srv is not None and self.port is not None:
            raise ValueError("srv discovery takes each target's port from its record: drop port")
        return self

    @property
    def name(self) -> str:
        """The DNS name to ask (``dns:`` or ``srv:``)."""
        return self.dns or self.srv or ""

    @property
    def kind(self) -> RecordKind:
        return "dns" if self.dns is not None else "srv"


class DnsConfig(Frozen):
    """``dns:``: the servers discovery asks (none: the system's /etc/resolv.conf).
    ``timeout``: one resolution's whole budget (every server and retry included)."""

    nameservers: tuple[str, ...] = Field((), max_length=10)
    timeout: Duration = Field(2.0, le=30.0)

    @field_validator("nameservers")
    @classmethod
    def _ip_literals(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            split_nameserver(text)  # ValueError names the problem
        return value

    def servers(self) -> tuple[tuple[str, int], ...]:
        """``nameservers`` as (ip, port), port 53 where the file gives none."""
        return tuple(split_nameserver(text) for text in self.nameservers)
