"""Reading a known-answer probe's answer off its stream (pure; docs/design.md §14).

The probe's own part of the check: it runs inside the exchange, within its timeout (in a
probe worker process too), and hands over a ``model.answer.Answer``; judging it is the
engine checks' (``engines.verify``).

Both OpenAI shapes, as vLLM, SGLang and llama.cpp stream them (docs/engines.md):
- completions: ``choices[0].text``; with ``"logprobs": N``, ``choices[0].logprobs`` =
  ``{"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}, ...]}``;
- chat: ``choices[0].delta.content``; with ``"logprobs": true, "top_logprobs": N``,
  ``choices[0].logprobs.content`` = ``[{"token", "logprob", "top_logprobs": [{"token",
  "logprob"}]}]`` (llama.cpp adds each token's ``"id"``, and uses this shape on
  completions too: docs/engines/llama-cpp.md);
- vLLM's ``"return_token_ids": true`` adds ``choices[0].token_ids``.
Anything else in an event is ignored; a value of the wrong type is skipped, never trusted.
Bounded: at most MAX_TOKENS tokens and MAX_CHARS characters are kept. The ``Answer`` it
hands over carries no configured secret: a backend may answer with the probe's own key,
and the answer's text reaches reasons, logs and alerts (docs/design.md §10).
"""

from __future__ import annotations

import math
from typing import Any

from llm_health.model.answer import Answer
from llm_health.model.redact import redact_secrets
from llm_health.probe.events import loads

MAX_TOKENS = 64
MAX_CHARS = 2000
TOP_LOGPROBS = 5  # alternatives asked for the first token (the consensus rule reads them)


def answer_request(api: str) -> dict[str, Any]:
    """The body fields that ask for log-probabilities and token ids, per API. Engines
    that do not know ``return_token_ids`` ignore it (vLLM and llama.cpp accept it)."""
    if api == "openai-chat":
        return {"logprobs": True, "top_logprobs": TOP_LOGPROBS}
    return {"logprobs": TOP_LOGPROBS}


class AnswerReader:
    """Folds a stream's decoded events (JSON objects) into an ``Answer``. ``secrets``:
    the probe's (``ProbeTarget.secrets``), removed from every text of the answer."""

    def __init__(self, api: str, secrets: frozenset[str] = frozenset()) -> None:
        self._chat = api == "openai-chat"
        self._secrets = secrets
        self._text: list[str] = []
        self._chars = 0
        self._tokens: list[str] = []
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._first_top: tuple[str, ...] = ()
        self.finished = False

    def feed(self, event: object) -> None:
        """One decoded event; sets ``finished`` when a choice carries a finish reason."""
        if not isinstance(event, dict):
            return
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        self._add_text(_text_of(choice, self._chat))
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            self._add_logprobs(logprobs)
        self._add_ids(choice.get("token_ids"))
        if choice.get("finish_reason") is not None:
            self.finished = True

    def feed_payloads(self, payloads: list[str]) -> bool:
        """Decoded SSE payloads, in order; True once the stream says it is done (a finish
        reason, or ``[DONE]``). One that is no JSON is skipped: the answer is judged on
        what could be read."""
        for payload in payloads:
            if payload.strip() == "[DONE]":
                self.finished = True
                return True
            try:
                self.feed(loads(payload))
            except ValueError:  # orjson's and json's decode errors (the wire's fault)
                continue
        return self.finished

    def answer(self, *, complete: bool) -> Answer:
        """What was read, secrets redacted (the whole text at once: a secret may be split
        over tokens, or cut by MAX_CHARS)."""
        return Answer(
            text=self._clean("".join(self._text)),
            tokens=tuple(self._clean(t) for t in self._tokens),
            token_ids=tuple(self._ids),
            logprobs=tuple(self._logprobs),
            first_top=tuple(self._clean(t) for t in self._first_top),
            complete=complete,
        )

    def _clean(self, text: str) -> str:
        return redact_secrets(text, self._secrets)

    def _add_text(self, text: str) -> None:
        if not text or self._chars >= MAX_CHARS:
            return
        piece = text[: MAX_CHARS - self._chars]
        self._text.append(piece)
        self._chars += len(piece)

    def _add_logprobs(self, logprobs: dict[str, Any]) -> None:
        entries = logprobs.get("content")
        if self._chat or isinstance(entries, list):  # llama.cpp: this shape on both APIs
            for entry in entries if isinstance(entries, list) else ():
                if isinstance(entry, dict):
                    self._add_chat_entry(entry)
            return
        tokens = _list(logprobs.get("tokens"))
        values = _list(logprobs.get("token_logprobs"))
        tops = _list(logprobs.get("top_logprobs"))
        for index, token in enumerate(tokens):
            value = values[index] if index < len(values) else None
            top = tops[index] if index < len(tops) else None
            alternatives = (
                tuple(k for k in top if isinstance(k, str)) if isinstance(top, dict) else ()
            )
            self._add_token(token, value, alternatives)

    def _add_chat_entry(self, entry: dict[str, Any]) -> None:
        top = entry.get("top_logprobs")
        alternatives = tuple(
            alt["token"]
            for alt in (top if isinstance(top, list) else ())
            if isinstance(alt, dict) and isinstance(alt.get("token"), str)
        )
        self._add_token(entry.get("token"), entry.get("logprob"), alternatives)
        self._add_ids([entry.get("id")] if "id" in entry else None)

    def _add_token(self, token: object, logprob: object, alternatives: tuple[str, ...]) -> None:
        if not isinstance(token, str) or len(self._tokens) >= MAX_TOKENS:
            return
        self._tokens.append(token)
        if _is_number(logprob):
            self._logprobs.append(_as_float(logprob))  # type: ignore[arg-type]
        if len(self._tokens) == 1:
            self._first_top = alternatives[:20]

    def _add_ids(self, ids: object) -> None:
        for value in ids if isinstance(ids, list) else ():
            if (
                isinstance(value, int)
                and not isinstance(value, bool)
                and len(self._ids) < MAX_TOKENS
            ):
                self._ids.append(value)


def _text_of(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
    else:
        content = choice.get("text")
    return content if isinstance(content, str) else ""


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _is_number(value: object) -> bool:
    """An int or float (NaN and infinities included: those are what the checks catch)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_float(value: float) -> float:
    """``float(value)``; an integer beyond a float's range (JSON has no bound, the stdlib
    reads it whole) is an infinity of its sign, which the checks catch as garbage."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def finite(values: tuple[float, ...]) -> bool:
    return all(math.isfinite(v) for v in values)
