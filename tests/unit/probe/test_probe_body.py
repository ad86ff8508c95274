"""The probe's request body per engine and cache bypass (probe.client.probe_body)."""

from __future__ import annotations

import re

import pytest

from llm_health.config.schema import ProbeSettings
from llm_health.engines.settings import VerifyConfig
from llm_health.probe.client import probe_body
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
