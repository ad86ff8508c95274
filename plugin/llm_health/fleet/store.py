"""The fleet's Redis client (redis.asyncio): the scripts of ``fleet.scripts`` and the reads
around them; the heartbeat has a blocking connection of its own (``fleet.pulse``). No retries here: the heartbeat loop is the retry (a failed heartbeat is
simply tried again at the next beat), and a failed publish is reported to the caller.

Every socket operation is bounded by ``heartbeat`` (at least 0.5 s): a Redis that hangs
looks like a Redis that is down, which is what fallback is for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis as blocking_redis
import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry as BlockingRetry

from llm_health.fleet import scripts
from llm_health.fleet.settings import FleetConfig
from llm_health.fleet.wire import Action, Membership, WireError, action_body, decode_membership

MAX_VERDICTS = 100_000  # fields read from the verdicts hash at most (HSCAN beyond)
log = logging.getLogger("llm_health")


class FleetStore:
    def __init__(self, settings: FleetConfig, member: str) -> None:
        self.settings = settings
        self.member = member
        url, timeout = settings.redis.get_secret_value(), max(0.5, settings.heartbeat)
        # Both connections (the loop's, the heartbeat's) bounded alike and never retried.
        options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "decode_responses": False,
        }
        self._redis = redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **options)
        prefix = f"llmh:{{{settings.name}}}"
        self.channel = f"{prefix}:events"
        self._keys = [
            f"{prefix}:members",
            f"{prefix}:epochs",
            f"{prefix}:verdicts",
            f"{prefix}:epoch",
            f"{prefix}:overrides",
            f"{prefix}:vouched",
        ]
        self._join = self._redis.register_script(scripts.JOIN)
        self._heartbeat = self._redis.register_script(scripts.HEARTBEAT)
        self._publish = self._redis.register_script(scripts.PUBLISH)
        self._act = self._redis.register_script(scripts.ACT)
        self._leave = self._redis.register_script(scripts.LEAVE)
        # The heartbeat's own connection, used only by its thread (``fleet.pulse``).
        self._pulse_redis = blocking_redis.Redis.from_url(
            url, retry=BlockingRetry(NoBackoff(), 0), **options
        )
        self._pulse_heartbeat = self._pulse_redis.register_script(scripts.HEARTBEAT)
        self._commands = 0  # Redis commands sent from the loop (scripts count one each)
        self._pulse_commands = 0  # and from the heartbeat's thread

    @property
    def commands(self) -> int:
        """Redis commands sent (scripts count one each)."""
        return self._commands + self._pulse_commands

    def _args(self, epoch: int, *more: str) -> list[str]:
        ttl_ms = str(round(self.settings.member_ttl * 1000))
        fresh_ms = str(round(self.settings.fresh * 1000))
        return [self.member, str(epoch), ttl_ms, self.channel, fresh_ms, *more]

    async def join(self) -> int:
        """Become a live member with a new epoch; returns it."""
        self._commands += 1
        reply = await self._join(keys=self._keys, args=self._args(0))
        try:
            return int(reply[0])
        except (TypeError, ValueError, IndexError):
            raise WireError("malformed join reply") from None

    async def heartbeat(self, epoch: int, vouch: bool = True) -> Membership | None:
        """Renew membership; the live members (None: we were evicted: join again).
        ``vouch``: our verdicts are current (our prober keeps up with what we own); a
        member that has not vouched for ``fresh`` is evicted (docs/design.md §12.3)."""
        self._commands += 1
        args = self._args(epoch, "1" if vouch else "0")
        return decode_membership(await self._heartbeat(keys=self._keys, args=args))

    def heartbeat_blocking(self, epoch: int, vouch: bool) -> Membership | None:
        """``heartbeat`` from the heartbeat's thread (``fleet.pulse``), on its own
        connection: blocks that thread, never the loop."""
        self._pulse_commands += 1
        args = self._args(epoch, "1" if vouch else "0")
        return decode_membership(self._pulse_heartbeat(keys=self._keys, args=args))

    async def publish(self, epoch: int, items: Sequence[tuple[str, str]]) -> list[str]:
        """Publish verdicts (endpoint key, body) in one round trip; per item "ok",
        "fenced" (we are not a live member with that epoch) or "not_owner"."""
        if not items:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for key, body in items:
            await self._publish(keys=self._keys, args=self._args(epoch, key, body), client=pipe)
        self._commands += len(items)
        replies = await pipe.execute()
        return [_status(reply) for reply in replies]

    async def act(self, epoch: int, key: str, action: Action) -> str:
        self._commands += 1
        reply = await self._act(
            keys=self._keys, args=self._args(epoch, key, action_body(action), action.kind)
        )
        return _status(reply)

    async def leave(self, epoch: int) -> None:
        self._commands += 1
        await self._leave(keys=self._keys, args=self._args(epoch))

    async def verdicts(self) -> dict[str, bytes]:
        """Every stored verdict (endpoint key -> stored text), at most MAX_VERDICTS."""
        return await self._hash(self._keys[2])

    async def stored(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The stored verdicts of ``keys`` (absent ones left out)."""
        if not keys:
            return {}
        self._commands += 1
        values = await self._redis.hmget(self._keys[2], list(keys))
        return {k: v for k, v in zip(keys, values, strict=True) if isinstance(v, bytes)}

    async def overrides(self) -> dict[str, bytes]:
        return await self._hash(self._keys[4])

    async def events(self) -> AsyncIterator[bytes]:
        """Messages on the events channel until the connection breaks (ConnectionError,
        TimeoutError). The caller subscribes again and resynchronises."""
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            self._commands += 1
            await pubsub.subscribe(self.channel)
            stop_if_cancelled()  # before waiting, maybe for long, for the first message
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is not None and isinstance(message.get("data"), bytes):
                    yield message["data"]
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2

    async def close(self) -> None:
        await self._redis.aclose()
        self._pulse_redis.close()

    async def _hash(self, name: str) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        cursor = 0
        while True:
            self._commands += 1
            cursor, chunk = await self._redis.hscan(name, cursor, count=1000)
            pairs = chunk.items() if isinstance(chunk, dict) else ()
            for field, value in pairs:
                if isinstance(field, bytes) and isinstance(value, bytes):
                    found[field.decode(errors="replace")] = value
            if cursor == 0 or len(found) >= MAX_VERDICTS:
                return found


def stop_if_cancelled() -> None:
    """Raise CancelledError if this task was cancelled during a Redis call that swallowed
    it: on Python 3.11, ``asyncio.wait_for`` (redis-py's bound on every socket write)
    returns a write that completes as the cancellation arrives and drops the
    CancelledError, the request still counted (``Task.cancelling``). A loop that went on
    would never end (a shutdown that hangs)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _status(reply: Any) -> str:
    if isinstance(reply, list) and reply and isinstance(reply[0], bytes):
        return reply[0].decode(errors="replace")
    return "malformed"


# What a call to Redis may fail with: the client's errors, the socket's, its bound, and an
# answer ``fleet.wire`` refuses.
RedisFailure = (RedisError, OSError, TimeoutError, WireError)


def failure_name(exc: BaseException) -> str:
    """An error's class only: a Redis error text may quote the URL (and its password)."""
    return type(exc).__name__
