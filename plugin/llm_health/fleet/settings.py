"""What ``fleet:`` configures, in domain form (no pydantic). Built by
``llm_health.config.FleetConfig.to_settings``. Units are in the names (``_s``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FleetSettings:
    """- ``redis_url``: where the fleet's state lives; may hold a password: never logged
      (``where`` is the printable scheme://host:port/db);
    - ``name``: replicas with the same name share probing (the Redis key prefix);
    - ``member_id``: this replica, unique in the fleet (default: hostname-pid);
    - ``heartbeat_s``: how often this replica renews its membership (and so confirms every
      verdict it owns);
    - ``member_ttl_s``: a member whose last heartbeat is older is gone: its endpoints move;
      Redis unreachable this long: every replica probes every endpoint itself (fallback);
    - ``fresh_s``: a verdict younger than this may be pushed at start without a probe.
    """

    redis_url: str
    where: str
    name: str
    member_id: str
    heartbeat_s: float = 1.0
    member_ttl_s: float = 3.0
    fresh_s: float = 6.0
