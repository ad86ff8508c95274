"""The probe's request body per engine and cache bypass (probe.client.probe_body)."""

from __future__ import annotations

import json
import re

import pytest

from llm_health.config.schema import ProbeSettings
from llm_health.engines.settings import VerifyConfig
from llm_health.probe.client import cache_bust_for, probe_body
from llm_health.probe.target import ProbeTarget


def target(**settings: object) -> ProbeTarget:
    return ProbeSettings(model="m", prompt="hi", **settings).to_target("c", "127.0.0.1:1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("engine", "salt", "cache_prompt", "nonce_prefix"),
    [
        ("vllm", True, None, False),
        ("sglang", True, None, False),
        ("llamacpp", False, False, False),
        ("tgi", False, None, True),
        ("trtllm", False, None, True),
        (None, False, None, True),  # not detected yet: a nonce prefix works everywhere
    ],
)
def test_auto_cache_bust_follows_the_engine(
    engine: str | None, salt: bool, cache_prompt: bool | None, nonce_prefix: bool
) -> None:
    body = probe_body(target(), engine)
    assert ("cache_salt" in body) is salt
    assert body.get("cache_prompt") == cache_prompt
    assert bool(re.fullmatch(r"[0-9a-f]{12} hi", body["prompt"])) is nonce_prefix
    assert body["max_tokens"] == 1 and body["stream"] is True and body["temperature"] == 0


def test_an_explicit_cache_bust_wins_over_the_engine() -> None:
    body = probe_body(target(cache_bust="salt"), "llamacpp")
    assert "cache_salt" in body and "cache_prompt" not in body
    assert probe_body(target(cache_bust="none"), "vllm")["prompt"] == "hi"


@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
def test_the_known_answer_body_asks_for_the_answer_and_its_logprobs(api: str) -> None:
    probe = target(api=api)
    question = VerifyConfig(prompt="The capital of France is", max_tokens=3)
    body = probe_body(probe, "tgi", question)  # tgi: prefix bust, never on the verify prompt
    text = body["messages"][0]["content"] if api == "openai-chat" else body["prompt"]
    assert text == "The capital of France is" and body["max_tokens"] == 3
    assert body["temperature"] == 0
    if api == "openai-chat":
        assert body["logprobs"] is True and body["top_logprobs"] == 5
    else:
        assert body["logprobs"] == 5
    assert "return_token_ids" not in body
    assert probe_body(probe, "vllm", question)["return_token_ids"] is True


@pytest.mark.parametrize("bust", ["auto", "salt", "prefix", "cache_prompt", "none"])
@pytest.mark.parametrize("engine", [None, "vllm", "llamacpp", "tgi"])
def test_a_kept_request_is_the_request_made_whole_with_a_new_nonce(
    bust: str, engine: str | None
) -> None:
    """The request is made once per endpoint and engine and only its nonce put in for
    each probe: byte for byte what building it whole with that nonce gives, the nonce
    new for every probe."""
    from llm_health.probe.http1 import route_of
    from llm_health.probe.request import Requests, probe_request

    probe = target(cache_bust=bust)
    requests = Requests()
    sent = [requests.get(probe, engine) for _ in range(3)]
    route = route_of(probe.url)
    busts = cache_bust_for(probe, engine) in ("prefix", "salt")
    for request in sent:
        nonces = re.findall(rb"[0-9a-f]{12}", request.partition(b"\r\n\r\n")[2])
        assert len(nonces) == (1 if busts else 0)
        nonce = nonces[0].decode() if nonces else "000000000000"
        assert request == probe_request(probe, engine, route, nonce)
    assert len(set(sent)) == (3 if busts else 1)


def test_a_prompt_holding_the_nonce_mark_is_still_sent_right() -> None:
    """The mark standing for the nonce in a kept request, found in the prompt itself: the
    request is made whole each time, the prompt as written."""
    from llm_health.probe.request import NONCE_MARK, Requests

    settings = ProbeSettings(model="m", prompt=f"odd {NONCE_MARK} prompt", cache_bust="salt")
    probe = settings.to_target("c", "127.0.0.1:1")
    body = Requests().get(probe, "vllm").partition(b"\r\n\r\n")[2]
    decoded = json.loads(body)
    assert decoded["prompt"] == f"odd {NONCE_MARK} prompt"
    assert re.fullmatch("[0-9a-f]{12}", decoded["cache_salt"])
