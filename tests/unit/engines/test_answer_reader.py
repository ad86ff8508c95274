"""Reading a known-answer stream's events (probe.answer) in both OpenAI shapes."""

from __future__ import annotations

import json
import math

from llm_health.probe.answer import MAX_TOKENS, AnswerReader, answer_request


def completion_chunk(
    token: str,
    logprob: float,
    top: dict[str, float],
    ids: list[int] | None = None,
    finish: str | None = None,
) -> dict[str, object]:
    choice: dict[str, object] = {
        "index": 0,
        "text": token,
        "logprobs": {"tokens": [token], "token_logprobs": [logprob], "top_logprobs": [top]},
        "finish_reason": finish,
    }
    if ids is not None:
        choice["token_ids"] = ids
    return {"choices": [choice]}


def chat_chunk(
    token: str, logprob: float, top: list[str], id_: int | None = None
) -> dict[str, object]:
    entry: dict[str, object] = {
        "token": token,
        "logprob": logprob,
        "top_logprobs": [{"token": t, "logprob": -1.0} for t in top],
    }
    if id_ is not None:
        entry["id"] = id_
    return {
        "choices": [{"index": 0, "delta": {"content": token}, "logprobs": {"content": [entry]}}]
    }


def test_completions_stream_gives_text_tokens_ids_logprobs_and_first_alternatives() -> None:
    reader = AnswerReader("openai-completions")
    reader.feed(completion_chunk(" Paris", -0.05, {" Paris": -0.05, " Lyon": -4.0}, [13679]))
    reader.feed(completion_chunk(" is", -0.2, {" is": -0.2}, [318], finish="length"))
    assert reader.finished
    answer = reader.answer(complete=True)
    assert answer.text == " Paris is" and answer.tokens == (" Paris", " is")
    assert answer.token_ids == (13679, 318) and answer.logprobs == (-0.05, -0.2)
    assert answer.first_top == (" Paris", " Lyon") and answer.first_token == " Paris"


def test_chat_stream_with_llamacpp_ids() -> None:
    reader = AnswerReader("openai-chat")
    reader.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})
    reader.feed(chat_chunk("!", math.nan, ["!", '"'], id_=0))
    answer = reader.answer(complete=False)
    assert answer.text == "!" and answer.token_ids == (0,) and math.isnan(answer.logprobs[0])
    assert answer.first_top == ("!", '"') and not answer.complete


def test_nan_written_by_the_engine_as_a_json_literal_is_read_as_nan() -> None:
    event = json.loads(
        '{"choices":[{"text":"!","logprobs":{"tokens":["!"],"token_logprobs":[NaN],"top_logprobs":[{"!":NaN}]}}]}'
    )
    reader = AnswerReader("openai-completions")
    reader.feed(event)
    assert math.isnan(reader.answer(complete=True).logprobs[0])


def test_hostile_shapes_are_skipped_not_trusted() -> None:
    reader = AnswerReader("openai-completions")
    for event in (
        [],
        {"choices": "x"},
        {"choices": [None]},
        {"choices": [{"text": 5, "logprobs": {"tokens": "abc", "token_logprobs": [True]}}]},
        {"choices": [{"text": "ok", "token_ids": ["1", True, 2]}]},
    ):
        reader.feed(event)
    answer = reader.answer(complete=True)
    assert answer.text == "ok" and answer.token_ids == (2,) and answer.tokens == ()


def test_answers_are_bounded() -> None:
    reader = AnswerReader("openai-completions")
    for _ in range(MAX_TOKENS + 20):
        reader.feed(completion_chunk("x" * 100, -1.0, {}, [1]))
    answer = reader.answer(complete=True)
    assert len(answer.tokens) == MAX_TOKENS and len(answer.token_ids) == MAX_TOKENS
    assert len(answer.text) <= 2000


def test_each_api_asks_for_logprobs_its_own_way() -> None:
    assert answer_request("openai-chat") == {"logprobs": True, "top_logprobs": 5}
    assert answer_request("openai-completions") == {"logprobs": 5}


def test_llamacpp_completions_use_the_chat_entries_with_ids() -> None:
    """docs/engines/llama-cpp.md: completions carry ``logprobs.content`` entries too."""
    reader = AnswerReader("openai-completions")
    entry = {
        "id": 4085,
        "token": "ape",
        "logprob": -3.12,
        "top_logprobs": [
            {"id": 4085, "token": "ape", "logprob": -3.12},
            {"id": 7, "token": "x", "logprob": -4.0},
        ],
    }
    reader.feed({"choices": [{"index": 0, "text": "ape", "logprobs": {"content": [entry]}}]})
    reader.feed(
        {"choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]}
    )
    answer = reader.answer(complete=reader.finished)
    assert answer.text == "ape" and answer.tokens == ("ape",) and answer.token_ids == (4085,)
    assert answer.first_top == ("ape", "x") and answer.complete


def test_a_logprob_too_large_for_a_float_is_read_as_an_infinity() -> None:
    """JSON holds integers of any size (the stdlib reads what orjson refuses): a log
    probability beyond a float's range is the endpoint's garbage, read as an infinity
    (which the checks catch), never an exception out of the probe."""
    reader = AnswerReader("openai-completions")
    event = {
        "choices": [{"text": "a", "logprobs": {"tokens": ["a"], "token_logprobs": ["LOGPROB"]}}]
    }
    payload = json.dumps(event).replace('"LOGPROB"', "-" + "9" * 400)
    assert not reader.feed_payloads([payload])
    logprobs = reader.answer(complete=False).logprobs
    assert len(logprobs) == 1 and math.isinf(logprobs[0])
