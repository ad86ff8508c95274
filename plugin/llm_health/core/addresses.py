"""Addresses as written in the config: "host:port" endpoints and server binds.

Pure parsing, no DNS. Every check is linear in the input's length (a validation regex
with nested quantifiers is exponential on a crafted name, and config reloads run beside
the prober), and only ASCII digits make a port ("٨٠٠٠" is not 8000).
"""

from __future__ import annotations

import ipaddress
import re

MAX_HOST_NAME = 253  # RFC 1035 §2.3.4, without the trailing dot
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_IPV4_LIKE = re.compile(r"[0-9.]+")


def split_address(address: str) -> tuple[str, int]:
    """ "10.0.0.1:8000" / "[::1]:8000" / "gpu-1.local:8000" -> (host, port); ValueError else."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not is_ascii_number(port_text):
        raise ValueError(f'"{address}" is not host:port')
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f'"{address}": port {port} is out of range 1-65535')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        _check_ipv6(address, ipaddress.IPv6Address(host), port)  # ValueError names the problem
        return host, port
    if _IPV4_LIKE.fullmatch(host):
        ipaddress.IPv4Address(host)
    elif not is_host_name(host):
        raise ValueError(f'"{address}": "{host}" is not a valid host name or IP address')
    return host, port


def _check_ipv6(address: str, ip: ipaddress.IPv6Address, port: int) -> None:
    """Two IPv6 spellings are refused. A zone id ("%eth0"): Envoy's socket addresses
    carry none, and the same literal would name a different host on each machine. An
    IPv4-mapped address: an IPv4 address in another spelling, which loopback checks and
    duplicate checks would not recognise (docs/design.md §6.3)."""
    if ip.scope_id is not None:
        raise ValueError(
            f'"{address}": an IPv6 zone id ("%{ip.scope_id}") is not allowed: Envoy cannot '
            "use one in a socket address; write a global or unique-local IPv6 address"
        )
    if ip.ipv4_mapped is not None:
        raise ValueError(
            f'"{address}": an IPv4-mapped IPv6 address is not allowed (it is '
            f'{ip.ipv4_mapped} in another spelling): write "{ip.ipv4_mapped}:{port}"'
        )


def is_ip_host(host: str) -> bool:
    """For a host that ``split_address`` returned: True if it is an IP literal (already
    checked there), False for a host name. No second parse."""
    return ":" in host or _IPV4_LIKE.fullmatch(host) is not None


def is_ascii_number(text: str) -> bool:
    """Digits 0-9 only: str.isdigit() also accepts other scripts' digits and superscripts."""
    return 0 < len(text) <= 10 and text.isascii() and text.isdigit()


def is_host_name(host: str) -> bool:
    """An RFC 1123 host name (letters, digits, inner hyphens; labels of 1-63; one trailing
    dot allowed), checked label by label in linear time."""
    name = host[:-1] if host.endswith(".") else host
    if not 0 < len(name) <= MAX_HOST_NAME:
        return False
    return all(_LABEL.fullmatch(label) for label in name.split("."))


def is_service_name(name: str) -> bool:
    """A DNS name to query for SRV records: a host name whose labels may also start with
    "_" (RFC 2782: "_http._tcp.svc.example")."""
    bare = name[:-1] if name.endswith(".") else name
    if not 0 < len(bare) <= MAX_HOST_NAME:
        return False
    return all(_LABEL.fullmatch(label.removeprefix("_")) for label in bare.split("."))


def split_nameserver(text: str) -> tuple[str, int]:
    """ "10.96.0.10" / "10.96.0.10:5353" / "::1" / "[::1]:5353" -> (ip, port; 53 when
    absent); ValueError names the problem. Only IP literals: resolving the resolver's own
    name would need a resolver."""
    try:
        return str(ipaddress.ip_address(text)), 53
    except ValueError:
        pass
    host, port = split_address(text)
    if not is_ip_host(host):
        raise ValueError(f'"{text}": a nameserver must be an IP address, optionally with ":port"')
    return str(ipaddress.ip_address(host)), port


def is_local_bind(bind: str) -> bool:
    """True for a Unix socket or a loopback host (127.0.0.0/8, ::1, localhost)."""
    if bind.startswith("unix:"):
        return True
    host, _port = split_address(bind)
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # any other host name may resolve to a routable address
