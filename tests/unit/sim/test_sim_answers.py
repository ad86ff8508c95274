"""Deterministic answers, logprobs and token ids on both APIs, and the garbage_tokens fault."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import aiohttp
import pytest

from llm_health.sim.faults import FaultSpec
from llm_health.sim.metrics import render_metrics
from llm_health.sim.server import SimHandle, SimSettings, running_sim
from llm_health.sim.tokens import split_answer, token_id
from tests.unit.sim.test_sim import chat, completion, read_events, set_fault

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


async def stream_choices(
    session: aiohttp.ClientSession, sim: SimHandle, path: str, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The token-carrying choices of a stream (role and usage chunks left out), raw events."""
    async with session.post(sim.base_url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()
        events = await read_events(resp)
    assert events[-1] == "[DONE]"
    choices = []
    for event in events[:-1]:
        chunk = json.loads(event)  # json.loads reads the NaN literal
        if not chunk["choices"]:
            continue  # the usage chunk
        choice = chunk["choices"][0]
        if "delta" in choice and "role" in choice["delta"]:
            continue  # the chat role chunk
        choices.append(choice)
    return choices, events


def text_of(choice: dict[str, Any]) -> str:
    return str(choice["text"] if "text" in choice else choice["delta"]["content"])


# ---------------------------------------------------------------- tokens


@pytest.mark.parametrize(
    ("answer", "tokens"),
    [
        (" Paris is a city", (" Paris", " is", " a", " city")),
        ("Paris", ("Paris",)),
        ("Hello,  world!\n", ("Hello,", "  world!\n")),
        ("  leading", ("  leading",)),
    ],
)
def test_split_answer_keeps_leading_whitespace_and_joins_back(
    answer: str, tokens: tuple[str, ...]
) -> None:
    assert split_answer(answer) == tokens
    assert "".join(tokens) == answer


def test_token_ids_are_stable_and_in_range() -> None:
    # crc32, not hash(): the same in every process (PYTHONHASHSEED does not matter).
    assert token_id(" Paris") == 13679
    assert token_id("!") != 0
    ids = {token_id(f" w{i}") for i in range(2000)}
    assert min(ids) >= 1 and max(ids) <= 32000
    assert len(ids) > 1900  # spread, not a constant


# ---------------------------------------------------------------- answers


async def test_answer_is_streamed_token_by_token_and_repeated_to_max_tokens(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    await set_fault(session, sim, answer="Hello world")
    choices, _ = await stream_choices(session, sim, COMPLETIONS, completion(max_tokens=5))
    assert [text_of(c) for c in choices] == ["Hello", " world", "Hello", " world", "Hello"]
    assert [c["finish_reason"] for c in choices] == [None, None, None, None, "length"]
    choices, _ = await stream_choices(session, sim, CHAT, chat(max_tokens=1, temperature=0.9))
    assert [text_of(c) for c in choices] == ["Hello"]  # cut at max_tokens; any temperature


async def test_without_logprobs_chunks_carry_null_and_no_token_ids(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    for path, body in ((COMPLETIONS, completion()), (CHAT, chat())):
        choices, _ = await stream_choices(session, sim, path, body)
        assert [c["logprobs"] for c in choices] == [None, None, None]
        assert not [c for c in choices if "token_ids" in c]
    assert sim.state.counters.logprobs_requests == 0


# ---------------------------------------------------------------- completions logprobs


async def test_completions_stream_carries_openai_logprobs_and_token_ids(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    body = completion(max_tokens=4, logprobs=3, return_token_ids=True)
    choices, events = await stream_choices(session, sim, COMPLETIONS, body)
    first = choices[0]
    assert first["text"] == " Paris"
    assert first["token_ids"] == [token_id(" Paris")]
    assert first["logprobs"] == {
        "tokens": [" Paris"],
        "token_logprobs": [-0.05],
        "top_logprobs": [{" Paris": -0.05, " Lyon": -4.0, " the": -5.0}],
        "text_offset": [0],
    }
    assert list(first["logprobs"]["top_logprobs"][0]) == [" Paris", " Lyon", " the"]
    assert [c["logprobs"]["text_offset"] for c in choices] == [[0], [6], [9], [11]]
    # " a" is an alternative itself: shown once, as the chosen token.
    assert choices[2]["logprobs"]["top_logprobs"] == [{" a": -0.05, " Lyon": -4.0, " the": -5.0}]
    body = completion(max_tokens=3, logprobs=5)
    third = (await stream_choices(session, sim, COMPLETIONS, body))[0][2]
    assert third["logprobs"]["top_logprobs"] == [
        {" a": -0.05, " Lyon": -4.0, " the": -5.0, " France": -6.0}
    ]
    for choice in choices:
        (token,) = choice["logprobs"]["tokens"]
        (top,) = choice["logprobs"]["top_logprobs"]
        assert token == choice["text"] and top[token] == choice["logprobs"]["token_logprobs"][0]
        assert list(top.values()) == sorted(top.values(), reverse=True)
        assert choice["token_ids"] == [token_id(token)]
        assert 1 <= choice["token_ids"][0] <= 32000
    assert '"logprobs":{"tokens":[" Paris"]' in events[0]  # compact, vLLM's key order
    assert sim.state.counters.logprobs_requests == 2


async def test_completions_logprobs_zero_shows_the_chosen_token_only(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    choices, _ = await stream_choices(session, sim, COMPLETIONS, completion(logprobs=0))
    assert [c["logprobs"]["top_logprobs"] for c in choices] == [
        [{" Paris": -0.05}],
        [{" is": -0.05}],
        [{" a": -0.05}],
    ]


async def test_completions_logprobs_are_capped_by_the_alternatives(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    await set_fault(session, sim, answer=" x", top_alternatives=[" y", " z"])
    choices, _ = await stream_choices(session, sim, COMPLETIONS, completion(logprobs=20))
    assert choices[0]["logprobs"]["top_logprobs"] == [{" x": -0.05, " y": -4.0, " z": -5.0}]
    total = sum(math.exp(lp) for lp in choices[0]["logprobs"]["top_logprobs"][0].values())
    assert total < 1.0


# ---------------------------------------------------------------- chat logprobs


async def test_chat_stream_carries_openai_logprobs_and_token_ids(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    body = chat(max_tokens=2, logprobs=True, top_logprobs=2, return_token_ids=True)
    choices, events = await stream_choices(session, sim, CHAT, body)
    role = json.loads(events[0])["choices"][0]
    assert role["delta"] == {"role": "assistant", "content": ""} and role["logprobs"] is None
    first = choices[0]
    assert first["delta"] == {"content": " Paris"}
    assert first["token_ids"] == [token_id(" Paris")]
    assert first["logprobs"] == {
        "content": [
            {
                "token": " Paris",
                "logprob": -0.05,
                "bytes": [32, 80, 97, 114, 105, 115],
                "top_logprobs": [
                    {"token": " Paris", "logprob": -0.05, "bytes": [32, 80, 97, 114, 105, 115]},
                    {"token": " Lyon", "logprob": -4.0, "bytes": [32, 76, 121, 111, 110]},
                ],
            }
        ]
    }
    (second,) = choices[1]["logprobs"]["content"]
    assert (second["token"], second["top_logprobs"][0]["token"]) == (" is", " is")
    assert choices[1]["finish_reason"] == "length"


async def test_chat_logprobs_without_top_logprobs_and_non_ascii_bytes(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    await set_fault(session, sim, answer=" café")
    choices, _ = await stream_choices(session, sim, CHAT, chat(max_tokens=1, logprobs=True))
    (entry,) = choices[0]["logprobs"]["content"]
    assert entry["token"] == " café"
    assert entry["bytes"] == list(" café".encode())  # 6 bytes: é is two
    assert len(entry["bytes"]) == 6
    assert entry["top_logprobs"] == []  # top_logprobs 0, as OpenAI and vLLM
    assert "token_ids" not in choices[0]


# ---------------------------------------------------------------- non-streamed


async def test_non_streamed_bodies_carry_every_logprob(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    body = completion(stream=False, max_tokens=5, logprobs=1, return_token_ids=True)
    async with session.post(sim.base_url + COMPLETIONS, json=body) as resp:
        doc = await resp.json()
    choice = doc["choices"][0]
    assert choice["text"] == " Paris is a city Paris"
    assert choice["logprobs"]["tokens"] == [" Paris", " is", " a", " city", " Paris"]
    assert choice["logprobs"]["text_offset"] == [0, 6, 9, 11, 16]
    assert choice["logprobs"]["token_logprobs"] == [-0.05] * 5
    assert choice["logprobs"]["top_logprobs"][3] == {" city": -0.05}
    assert choice["token_ids"] == [token_id(t) for t in choice["logprobs"]["tokens"]]
    body = chat(stream=False, max_tokens=3, logprobs=True, top_logprobs=1)
    async with session.post(sim.base_url + CHAT, json=body) as resp:
        doc = await resp.json()
    choice = doc["choices"][0]
    assert choice["message"]["content"] == " Paris is a"
    assert [e["token"] for e in choice["logprobs"]["content"]] == [" Paris", " is", " a"]
    assert [len(e["top_logprobs"]) for e in choice["logprobs"]["content"]] == [1, 1, 1]
    assert "token_ids" not in choice


# ---------------------------------------------------------------- garbage_tokens


async def test_garbage_tokens_streams_bangs_with_nan_logprobs_at_normal_ttft(
    session: aiohttp.ClientSession,
) -> None:
    spec = FaultSpec(fault="garbage_tokens", ttft=0.02, tpot=0.0)
    async with running_sim(SimSettings(fault=spec)) as sim:
        body = completion(max_tokens=3, logprobs=2, return_token_ids=True)
        started = time.monotonic()
        async with session.post(sim.base_url + COMPLETIONS, json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            first = await resp.content.readline()
            first_at = time.monotonic() - started
            rest = await resp.read()
        raw = first + rest
        assert first_at < 0.5  # fast: a TTFT-only prober sees nothing wrong
        assert b"NaN" in raw  # the literal, as Python's json writes it
        events = [line[6:].decode() for line in raw.split(b"\n") if line.startswith(b"data: ")]
        assert events[-1] == "[DONE]"
        choices = [json.loads(e)["choices"][0] for e in events[:-1]]
        assert [c["text"] for c in choices] == ["!", "!", "!"]
        assert [c["token_ids"] for c in choices] == [[0], [0], [0]]
        assert choices[-1]["finish_reason"] == "length"
        logprobs = choices[0]["logprobs"]
        assert logprobs["tokens"] == ["!"] and math.isnan(logprobs["token_logprobs"][0])
        (top,) = logprobs["top_logprobs"]
        assert list(top) == ["!", '"'] and all(math.isnan(v) for v in top.values())
        counters = sim.state.counters
        assert (counters.faulted, counters.completed, counters.failed) == (1, 1, 0)


async def test_garbage_tokens_on_chat_and_non_streamed(session: aiohttp.ClientSession) -> None:
    spec = FaultSpec(fault="garbage_tokens", ttft=0.0, tpot=0.0)
    async with running_sim(SimSettings(fault=spec)) as sim:
        body = chat(max_tokens=2, logprobs=True, top_logprobs=3)
        choices, _ = await stream_choices(session, sim, CHAT, body)
        assert [c["delta"] for c in choices] == [{"content": "!"}, {"content": "!"}]
        (entry,) = choices[0]["logprobs"]["content"]
        assert (entry["token"], entry["bytes"]) == ("!", [33])
        assert math.isnan(entry["logprob"])
        assert [t["token"] for t in entry["top_logprobs"]] == ["!", '"', "#"]
        assert all(math.isnan(t["logprob"]) for t in entry["top_logprobs"])
        body = completion(stream=False, max_tokens=4)
        async with session.post(sim.base_url + COMPLETIONS, json=body) as resp:
            assert resp.status == 200
            doc = await resp.json()
        assert doc["choices"][0]["text"] == "!!!!"
        assert doc["choices"][0]["logprobs"] is None


async def test_garbage_tokens_heals_when_the_fault_is_cleared(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    await set_fault(session, sim, fault="garbage_tokens")
    choices, _ = await stream_choices(session, sim, COMPLETIONS, completion(max_tokens=1))
    assert text_of(choices[0]) == "!"
    await set_fault(session, sim, fault="none")
    choices, _ = await stream_choices(session, sim, COMPLETIONS, completion(max_tokens=1))
    assert text_of(choices[0]) == " Paris"


# ---------------------------------------------------------------- accounting


async def test_logprobs_requests_are_counted_and_recorded(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    await stream_choices(session, sim, COMPLETIONS, completion(logprobs=2))
    await stream_choices(session, sim, CHAT, chat(logprobs=True, top_logprobs=4))
    await stream_choices(session, sim, CHAT, chat(return_token_ids=True, temperature=0))
    async with session.get(f"{sim.base_url}/sim/stats") as resp:
        stats = await resp.json()
    assert (stats["requests"], stats["logprobs_requests"]) == (3, 2)
    assert [r["logprobs"] for r in stats["recent"]] == [2, 4, None]
    assert [r["return_token_ids"] for r in stats["recent"]] == [False, False, True]
    assert stats["recent"][2]["temperature"] == 0.0
    text = render_metrics(sim.state)
    assert 'llm_health_sim_logprobs_requests_total{model_name="sim-model"} 2.0' in text
