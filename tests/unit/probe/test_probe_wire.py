"""The runtime <-> probe worker pipe (probe/wire.py): frames across reads of any size,
batches per loop turn, and what an unusable pipe raises."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.pool import shard
from llm_health.probe.wire import HEADER, MAX_FRAME, FrameError, FrameReader, Outbox, frame


def test_frames_survive_any_split_of_the_stream() -> None:
    batches = [
        [("probe", 1, "c/a:1", None, False)],
        [("result", 1, ProbeResult(Outcome.FAST, 1.0, ttft_ms=3.5), 0), ("token", 2)],
        [],
    ]
    stream = b"".join(frame(b) for b in batches)
    for size in (1, 2, 3, 7, 64, len(stream)):
        reader = FrameReader()
        seen = []
        for start in range(0, len(stream), size):
            seen.extend(reader.feed(stream[start : start + size]))
        assert seen == batches, size


NOT_A_LIST = pickle.dumps({"a": 1})


@pytest.mark.parametrize(
    "data,why",
    [
        (HEADER.pack(MAX_FRAME + 1), "frame of"),
        (HEADER.pack(len(NOT_A_LIST)) + NOT_A_LIST, "not a list"),
    ],
)
def test_an_unusable_pipe_raises_frame_error(data: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        list(FrameReader().feed(data))


async def test_the_outbox_writes_one_frame_per_loop_turn() -> None:
    writes: list[bytes] = []
    outbox = Outbox(writes.append)
    for i in range(100):
        outbox.put(("token", i))
    assert writes == []  # nothing written before the turn ends
    await asyncio.sleep(0)
    assert len(writes) == 1
    (batch,) = FrameReader().feed(writes[0])
    assert batch == [("token", i) for i in range(100)]
    outbox.put(("token", 100))
    await asyncio.sleep(0)
    assert len(writes) == 2


def test_an_endpoint_always_goes_to_the_same_worker_and_all_are_used() -> None:
    keys = [f"c/10.0.{i // 250}.{i % 250}:8000" for i in range(1000)]
    first = [shard(k, 4) for k in keys]
    assert first == [shard(k, 4) for k in keys]
    counts = [first.count(w) for w in range(4)]
    assert min(counts) > 200, counts  # about a quarter each
