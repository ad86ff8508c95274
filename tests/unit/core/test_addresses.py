"""Address parsing (core/addresses.py) and the config fields built on it: an IPv6 zone id
("%eth0") and an IPv4-mapped IPv6 address ("::ffff:127.0.0.1") are refused, for endpoints
and for server binds, each with a message saying what to write instead (docs/design.md
§6.3, §9.4)."""

from __future__ import annotations

import pytest

from llm_health.config import parse_config
from llm_health.core.addresses import split_address
from llm_health.errors import ConfigError

ZONE = (
    '"[fe80::1%eth0]:9001": an IPv6 zone id ("%eth0") is not allowed: Envoy cannot use one '
    "in a socket address; write a global or unique-local IPv6 address"
)
MAPPED = (
    '"[::ffff:127.0.0.1]:9001": an IPv4-mapped IPv6 address is not allowed (it is 127.0.0.1 '
    'in another spelling): write "127.0.0.1:9001"'
)
ENDPOINT = "clusters: [{{name: a, endpoints: [{{address: '{address}'}}]}}]\n"


@pytest.mark.parametrize(
    ("address", "message"), [("[fe80::1%eth0]:9001", ZONE), ("[::ffff:127.0.0.1]:9001", MAPPED)]
)
def test_split_address_refuses_zone_ids_and_mapped_addresses(address: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        split_address(address)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("address", "needle"),
    [
        ("[fe80::1%25eth0]:80", 'zone id ("%25eth0")'),
        ("[2001:db8::1%0]:80", 'zone id ("%0")'),
        ("[::ffff:10.0.0.7]:8000", 'write "10.0.0.7:8000"'),
        ("[::FFFF:0a00:0007]:8000", 'write "10.0.0.7:8000"'),
        ("[0:0:0:0:0:ffff:7f00:1]:18000", 'write "127.0.0.1:18000"'),
    ],
)
def test_every_spelling_is_refused(address: str, needle: str) -> None:
    with pytest.raises(ValueError, match="is not allowed") as caught:
        split_address(address)
    assert needle in str(caught.value)


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("[::1]:8000", "::1"),
        ("[fe80::1]:80", "fe80::1"),
        ("[2001:db8::ffff:1]:80", "2001:db8::ffff:1"),
        ("[::ffff]:80", "::ffff"),
        ("10.0.0.1:1", "10.0.0.1"),
    ],
)
def test_other_ip_literals_still_parse(address: str, host: str) -> None:
    assert split_address(address) == (host, int(address.rsplit(":", 1)[1]))


@pytest.mark.parametrize(
    ("address", "message"), [("[fe80::1%eth0]:9001", ZONE), ("[::ffff:127.0.0.1]:9001", MAPPED)]
)
def test_validate_refuses_them_as_endpoints(address: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(ENDPOINT.format(address=address), "t.yaml", {})
    assert caught.value.messages == [f"t.yaml:1 clusters[0].endpoints[0].address: {message}"]


@pytest.mark.parametrize(
    ("section", "key"),
    [("server", "grpc"), ("server", "http"), ("server", "authz"), ("admin", "grpc")],
)
@pytest.mark.parametrize(
    ("address", "message"), [("[fe80::1%eth0]:9001", ZONE), ("[::ffff:127.0.0.1]:9001", MAPPED)]
)
def test_validate_refuses_them_as_server_binds(
    section: str, key: str, address: str, message: str
) -> None:
    text = f"{section}: {{{key}: '{address}'}}\n" + ENDPOINT.format(address="10.0.0.1:80")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "t.yaml", {})
    assert caught.value.messages == [f"t.yaml:1 {section}.{key}: {message}"]
