"""``fleet:``: what the file configures for fleet mode (docs/design.md §12), validated, and
the type the fleet receives (``config.schema`` composes it into ``Config``).

- ``redis``: where the fleet's state lives; may hold a password: never logged (``where``
  is the printable scheme://host:port/db);
- ``name``: replicas with the same name share probing (the Redis key prefix);
- ``member_id``: this replica, unique in the fleet (``member``: else hostname-pid);
- ``heartbeat``: how often this replica renews its membership (and so confirms every
  verdict it owns), in seconds;
- ``member_ttl``: a member whose last heartbeat is older is gone: its endpoints move;
  Redis unreachable this long: every replica probes every endpoint itself (fallback);
- ``fresh``: a verdict younger than this may be pushed at start without a probe.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from llm_health.core.addresses import is_local_bind
from llm_health.core.settings import Duration, Frozen

_FLEET_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


class FleetConfig(Frozen):
    """``fleet:``: replicas sharing one probe per endpoint through Redis (docs/design.md
    §12). ``redis`` is a secret (it may carry a password): only scheme://host:port/db is
    ever shown. Off loopback (and not a Unix socket) it must carry credentials: whoever
    writes the fleet's keys can change every replica's verdicts."""

    redis: SecretStr
    name: str = Field(min_length=1, max_length=128)
    member_id: str | None = Field(None, max_length=128)
    heartbeat: Duration = Field(1.0, ge=0.1, le=60.0)
    member_ttl: Duration = Field(3.0, le=600.0)

    @field_validator("redis")
    @classmethod
    def _redis_url(cls, value: SecretStr) -> SecretStr:
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        if parts.scheme == "unix":
            if not parts.path.startswith("/"):
                raise ValueError("a unix:// URL needs an absolute socket path")
            return value
        try:
            host, port = parts.hostname, parts.port
        except ValueError:
            raise ValueError("the URL's port is not a number in 1-65535") from None
        if not host:
            raise ValueError("the URL needs a host, e.g. redis://10.0.0.5:6379/0")
        if port is not None and not 1 <= port <= 65535:
            raise ValueError("the URL's port is not in 1-65535")
        if parts.password is None and not is_local_bind(f"{_bracketed(host)}:{port or 6379}"):
            raise ValueError(
                f'Redis at "{host}" is not on loopback: put credentials in the URL '
                "(redis://:${REDIS_PASSWORD}@host:6379/0 or redis://user:pass@...); anyone "
                "who can write the fleet's keys changes every replica's verdicts"
            )
        return value

    @field_validator("name", "member_id")
    @classmethod
    def _plain_word(cls, value: str | None) -> str | None:
        if value is not None and not _FLEET_WORD.fullmatch(value):
            raise ValueError(
                f'"{value}" must be 1-128 of A-Z a-z 0-9 _ . : - starting with a letter or digit'
            )
        return value

    @model_validator(mode="after")
    def _ttl_over_heartbeat(self) -> FleetConfig:
        if self.member_ttl < 2 * self.heartbeat:
            raise ValueError(
                f"member_ttl ({self.member_ttl:g} s) must be at least twice heartbeat "
                f"({self.heartbeat:g} s): one late heartbeat must not evict a member"
            )
        return self

    @property
    def where(self) -> str:
        """The Redis URL without its credentials: what logs and /status show."""
        return redis_where(self.redis.get_secret_value())

    @property
    def fresh(self) -> float:
        """Seconds a stored verdict counts as fresh at a warm start (docs/design.md §12.7)."""
        return 2 * self.member_ttl

    def member(self, default: str) -> str:
        """This replica's member id: ``member_id``, else ``default`` (the caller's
        hostname-pid: unique as long as the configured ids are)."""
        return self.member_id or default


def redis_where(url: str) -> str:
    """A Redis URL without its credentials: what logs and /status may show."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = _bracketed(parts.hostname or "")
    return f"{parts.scheme}://{host}:{parts.port or 6379}{parts.path}"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
