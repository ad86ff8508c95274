"""`admin:` config: loopback by default, a token required off loopback."""

from __future__ import annotations

import pytest

from llm_health.config import is_local_bind, parse_config
from llm_health.errors import ConfigError

BASE = "clusters:\n  - name: a\n    endpoints: [{address: 127.0.0.1:8000}]\n"
TOKEN = "0123456789abcdef-token"


def load(admin: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return parse_config(admin + BASE, "llm-health.yaml", env or {})


def errors(admin: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(admin, env)
    return caught.value.messages


def test_default_is_the_main_server_without_token() -> None:
    config = load("")
    assert config.admin.grpc is None and config.admin.token is None


@pytest.mark.parametrize(
    "bind", ["127.0.0.1:18001", "'[::1]:18001'", "localhost:18001", "unix:/run/a.sock"]
)
def test_local_binds_need_no_token(bind: str) -> None:
    assert load(f"admin:\n  grpc: {bind}\n").admin.grpc == bind.strip("'")


@pytest.mark.parametrize(
    "bind", ["0.0.0.0:18001", "10.1.2.3:18001", "'[::]:18001'", "gw.example:18001"]
)
def test_non_loopback_without_token_is_rejected(bind: str) -> None:
    (message,) = errors(f"admin:\n  grpc: {bind}\n")
    assert message.startswith("llm-health.yaml:1 admin: ")
    assert "is not a loopback address: set admin.token" in message


def test_non_loopback_with_token_from_env() -> None:
    config = load(
        "admin:\n  grpc: 0.0.0.0:18001\n  token: ${ADMIN_TOKEN}\n", {"ADMIN_TOKEN": TOKEN}
    )
    assert config.admin.token is not None
    assert config.admin.token.get_secret_value() == TOKEN
    assert TOKEN not in repr(config) and TOKEN not in str(config.admin)


def test_short_token_rejected_without_echoing_it() -> None:
    (message,) = errors("admin:\n  token: hunter2\n")
    assert "admin.token: must be at least 16 characters" in message
    assert "hunter2" not in message


@pytest.mark.parametrize("token", ["0123456789 abcdef-token", "0123456789abcdéf-token"])
def test_token_that_is_no_header_value_is_refused_like_server_token(token: str) -> None:
    """admin.token and server.token are both sent as gRPC metadata: one rule, one message."""
    env = {"TOKEN": token}
    (admin,) = errors("admin:\n  token: ${TOKEN}\n", env)
    (server,) = errors("server:\n  token: ${TOKEN}\n", env)
    shape = "must be printable ASCII without spaces (it is sent as a header)"
    assert admin == f"llm-health.yaml:2 admin.token: {shape}", admin
    assert admin.replace("admin.token", "server.token") == server
    assert token not in admin


def test_typo_gets_a_suggestion() -> None:
    (message,) = errors("admin:\n  tokn: x\n")
    assert 'admin.tokn: unknown key (did you mean "token"?)' in message


@pytest.mark.parametrize(
    ("bind", "local"),
    [
        ("127.0.0.1:1", True),
        ("127.8.9.10:1", True),
        ("[::1]:1", True),
        ("LOCALHOST:1", True),
        ("unix:/tmp/x", True),
        ("0.0.0.0:1", False),
        ("[::]:1", False),
        ("192.168.1.1:1", False),
        ("example.com:1", False),
    ],
)
def test_is_local_bind(bind: str, local: bool) -> None:
    assert is_local_bind(bind) is local
