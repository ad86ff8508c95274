"""A micro-probe's request (docs/design.md §2, §14.4): its body per engine (the cache
bypass, a known-answer probe's question), its head, and the request kept made per
endpoint with only the nonce new each time."""

from __future__ import annotations

import json
import os
import random
from typing import Any, Protocol

from llm_health.probe.answer import answer_request
from llm_health.probe.http1 import Route, request_head, route_of
from llm_health.probe.target import ProbeTarget

PROBE_HEADER = "X-LLM-Probe"
NONCE_BYTES = 6  # the cache bypass's nonce: 12 hex digits
# The nonce only has to differ from probe to probe (it keys no secret): a generator
# seeded once from the OS, not a system call for every probe as ``secrets`` makes.
_NONCES = random.Random(os.urandom(16))
os.register_at_fork(after_in_child=lambda: _NONCES.seed(os.urandom(16)))  # never shared
MAX_KEPT_REQUESTS = 20_000  # endpoints whose request is kept made (``Requests``)
# Stands for the nonce in a kept request (``Requests``): as long as a nonce, and written
# by JSON as it is, so the Content-Length is the same.
NONCE_MARK = "<nonce-mark>"


class Question(Protocol):
    """What a known-answer probe asks (docs/design.md §14.1): ``prompt`` at temperature 0,
    for ``max_tokens`` tokens. The engine checks pass their ``probe.verify`` settings."""

    @property
    def prompt(self) -> str: ...

    @property
    def max_tokens(self) -> int: ...


# cache_bust "auto": what bypasses the prefix cache on each engine (docs/engines.md).
CACHE_BUST_BY_ENGINE = {"vllm": "salt", "sglang": "salt", "llamacpp": "cache_prompt"}


def cache_bust_for(target: ProbeTarget, engine: str | None) -> str:
    """The cache bypass in force: the configured one, or by engine for "auto" (a nonce
    prefix while the engine is unknown: it works on every engine)."""
    if target.cache_bust != "auto":
        return target.cache_bust
    return CACHE_BUST_BY_ENGINE.get(engine or "", "prefix")


def probe_body(
    target: ProbeTarget,
    engine: str | None = None,
    question: Question | None = None,
    nonce: str | None = None,
) -> dict[str, Any]:
    """The request body: stream, 1 token, greedy; cache busting per ``target.cache_bust``.

    ``salt``: vLLM's and SGLang's ``cache_salt`` gives the probe its own prefix-cache
    namespace, so it neither hits nor pollutes users' cached prefixes. ``cache_prompt``:
    llama.cpp's ``"cache_prompt": false`` (it reuses a slot's cached prefix otherwise).
    ``prefix``: a random nonce in front of the prompt does the same on any engine (a few
    more prompt tokens). ``question``: the known-answer form: its prompt, ``max_tokens``,
    log-probabilities and token ids asked for; never a nonce prefix, which would change
    the answer (the salt and cache_prompt do not). ``nonce``: 12 hex digits (random when
    not given).
    """
    nonce = new_nonce() if nonce is None else nonce
    bust = cache_bust_for(target, engine)
    prompt = question.prompt if question is not None else target.prompt
    if bust == "prefix" and question is None:
        prompt = f"{nonce} {prompt}"
    max_tokens = question.max_tokens if question is not None else 1
    body: dict[str, Any] = {"stream": True, "max_tokens": max_tokens, "temperature": 0, "top_p": 1}
    if target.model:
        body["model"] = target.model
    if target.api == "openai-chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if bust == "salt":
        body["cache_salt"] = nonce
    elif bust == "cache_prompt":
        body["cache_prompt"] = False
    if question is not None:
        body.update(answer_request(target.api))
        if engine == "vllm":
            body["return_token_ids"] = True  # vLLM >= 0.10; ids show token-0 garbage
    return body


def new_nonce() -> str:
    """12 hex digits, new for every probe (the cache bypass: ``probe_body``)."""
    return f"{_NONCES.getrandbits(8 * NONCE_BYTES):0{2 * NONCE_BYTES}x}"


def probe_request(
    target: ProbeTarget,
    engine: str | None,
    route: Route,
    nonce: str,
    question: Question | None = None,
) -> bytes:
    """The whole request, head and body (``probe_body`` with this ``nonce``)."""
    body = json.dumps(probe_body(target, engine, question, nonce)).encode()
    headers = {**target.headers, PROBE_HEADER: "true", "Accept": "text/event-stream"}
    return request_head(route, headers, len(body)) + body


class Requests:
    """A probe's request per endpoint, made once per target and engine: only the nonce
    differs from one probe to the next, and building the head and the JSON body is a
    large part of the exchange's CPU (docs/design.md §16.10). A request whose
    nonce cannot be told apart (the prompt holds the mark) is built whole every time."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[ProbeTarget, str | None, tuple[bytes, ...] | None]] = {}

    def get(self, target: ProbeTarget, engine: str | None) -> bytes:
        made = self._made.get(target.key)
        if made is None or made[0] is not target or made[1] != engine:
            if made is None and len(self._made) >= MAX_KEPT_REQUESTS:
                self._made.clear()  # endpoints come and go (discovery): start afresh
            made = target, engine, _split_at_nonce(target, engine)
            self._made[target.key] = made
        parts = made[2]
        nonce = new_nonce()
        if parts is None:
            return probe_request(target, engine, route_of(target.url), nonce)
        return nonce.encode().join(parts)


def _split_at_nonce(target: ProbeTarget, engine: str | None) -> tuple[bytes, ...] | None:
    """The request in pieces around its nonce (one nonce or none), or None if the mark
    shows up elsewhere in it."""
    marked = probe_request(target, engine, route_of(target.url), NONCE_MARK)
    parts = tuple(marked.split(NONCE_MARK.encode()))
    expected = 1 if cache_bust_for(target, engine) in ("prefix", "salt") else 0
    return parts if len(parts) == expected + 1 else None
