"""The OpenAI wire format as vLLM speaks it: request validation and response documents.

Request side: the inference body is checked the way vLLM checks it, and refused with a
:class:`BadRequest` carrying the HTTP status and OpenAI error type. Response side: error
documents, whole completions, and the SSE chunks of a stream (role delta, one chunk per
token, optional usage chunk, ``[DONE]``). Nothing here waits or picks a fault.

Logprobs, when asked for, come in the two OpenAI shapes vLLM uses. Completions
(``"logprobs": N``, 0..20): ``{"tokens": [...], "token_logprobs": [...],
"top_logprobs": [{token: logprob, ...}], "text_offset": [...]}`` with the chosen token and
up to N-1 runners-up in each ``top_logprobs`` dict (the chosen one alone for N = 0). Chat
(``"logprobs": true, "top_logprobs": N``): ``{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}, ...]}]}`` with the first N candidates,
chosen first (none for N = 0). ``"return_token_ids": true`` adds ``"token_ids"`` to the
choice. NaN logprobs (``garbage_tokens``) are written as the JSON literal ``NaN``, as
vLLM's Python JSON does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from aiohttp import web

from llm_health.sim.state import SimSettings
from llm_health.sim.tokens import Step

__all__ = [
    "DONE_EVENT",
    "JSON_CONTENT_TYPE",
    "MAX_LOGPROBS",
    "SSE_HEADERS",
    "BadRequest",
    "Kind",
    "Params",
    "Reply",
    "check_auth",
    "error_body",
    "error_response",
    "full_body",
    "generated",
    "parse_params",
    "read_json",
    "role_chunk",
    "send_event",
    "token_chunk",
    "usage_chunk",
]

Kind = Literal["completions", "chat"]

#: vLLM's default when a request leaves ``max_tokens`` out.
_DEFAULT_MAX_TOKENS = 16
#: vLLM's default ``--max-logprobs``: more logprobs per token are refused with 400.
MAX_LOGPROBS = 20

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
JSON_CONTENT_TYPE = "application/json"
DONE_EVENT = b"data: [DONE]\n\n"


# ------------------------------------------------------------ requests


class BadRequest(Exception):
    """A request the simulator refuses; carries the HTTP status and OpenAI error type."""

    def __init__(self, message: str, status: int = 400, error_type: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.error_type = error_type


@dataclass(frozen=True)
class Params:
    """The parts of an inference request body the simulator uses.

    ``logprobs`` is how many candidates to show per token, or None for no logprobs at
    all: completions' ``"logprobs": N``; chat's ``top_logprobs`` (default 0) when
    ``"logprobs": true``. ``temperature`` and ``cache_prompt`` (llama.cpp) are validated
    and recorded, and change nothing.
    """

    model: str
    stream: bool
    max_tokens: int
    include_usage: bool
    prompt: object
    messages: object
    cache_salt: str | None
    logprobs: int | None = None
    return_token_ids: bool = False
    temperature: float | None = None
    cache_prompt: bool | None = None


def check_auth(request: web.Request, settings: SimSettings) -> None:
    """Raise a 401 BadRequest if an API key is configured and not presented."""
    if settings.api_key is None:
        return
    if request.headers.get("Authorization") != f"Bearer {settings.api_key}":
        raise BadRequest("Unauthorized", status=401)


async def read_json(request: web.Request) -> object:
    """Decode the request body as JSON; raise ValueError with the reason otherwise."""
    raw = await request.read()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"request body is not valid JSON: {exc}") from exc


def parse_params(body: object, kind: Kind, settings: SimSettings) -> Params:
    """Validate an inference body the way vLLM would; raise BadRequest naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model", settings.model)
    if not isinstance(model, str):
        raise BadRequest('"model" must be a string')
    if model != settings.model and not settings.accept_any_model:
        raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest('"stream" must be a boolean')
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = _DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(f'"max_tokens" must be a positive integer, got {max_tokens!r}')
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise BadRequest('"cache_salt" must be a string')
    prompt, messages = _parse_input(body, kind)
    return Params(
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        include_usage=_include_usage(body),
        prompt=prompt,
        messages=messages,
        cache_salt=cache_salt,
        logprobs=_parse_logprobs(body, kind),
        return_token_ids=_optional_bool(body, "return_token_ids") or False,
        temperature=_parse_temperature(body),
        cache_prompt=_optional_bool(body, "cache_prompt"),
    )


def _optional_bool(body: Mapping[str, object], key: str) -> bool | None:
    """``body[key]`` if it is a boolean, None if absent or null; BadRequest otherwise."""
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f'"{key}" must be a boolean, got {value!r}')
    return value


def _logprobs_count(key: str, value: object) -> int:
    """A count of logprobs 0..MAX_LOGPROBS; BadRequest naming ``key`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f'"{key}" must be an integer between 0 and {MAX_LOGPROBS}, got {value!r}')
    if value > MAX_LOGPROBS:
        raise BadRequest(
            f'"{key}": requested {value} logprobs, which is greater than max allowed: '
            f"{MAX_LOGPROBS}"
        )
    return value


def _parse_logprobs(body: Mapping[str, object], kind: Kind) -> int | None:
    """Candidates to show per token, or None: no logprobs (see :class:`Params`)."""
    top = body.get("top_logprobs")
    top_count = None if top is None else _logprobs_count("top_logprobs", top)
    logprobs = body.get("logprobs")
    if kind == "completions":  # an integer N; top_logprobs is a chat field: checked, unused
        return None if logprobs is None else _logprobs_count("logprobs", logprobs)
    wanted = _optional_bool(body, "logprobs")
    if not wanted:
        if top_count:
            raise BadRequest('when using "top_logprobs", "logprobs" must be set to true')
        return None
    return top_count or 0


def _parse_temperature(body: Mapping[str, object]) -> float | None:
    """``temperature``: absent/null, or a finite number >= 0 (vLLM refuses negatives)."""
    value = body.get("temperature")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f'"temperature" must be a number, got {value!r}')
    if not math.isfinite(value) or value < 0:
        raise BadRequest(f'"temperature" must be a non-negative number, got {value!r}')
    return float(value)


def _parse_input(body: Mapping[str, object], kind: Kind) -> tuple[object, object]:
    """Return ``(prompt, messages)``; the one the endpoint needs must be present."""
    if kind == "completions":
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or not prompt:
            raise BadRequest('"prompt" is required: a non-empty string or list')
        return prompt, None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest('"messages" is required: a non-empty list')
    if not all(isinstance(message, dict) for message in messages):
        raise BadRequest('"messages" must be a list of objects')
    return None, messages


def _include_usage(body: Mapping[str, object]) -> bool:
    """True if ``stream_options.include_usage`` asks for a final usage chunk."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


# ------------------------------------------------------------ errors


def error_body(message: str, error_type: str, code: int) -> dict[str, object]:
    """An OpenAI-style error document."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def error_response(
    status: int, message: str, error_type: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An OpenAI-style JSON error response."""
    return web.json_response(
        error_body(message, error_type, status), status=status, headers=headers
    )


# ------------------------------------------------------------ completions


class Reply(Protocol):
    """What a response document is built from: the call's identity and its request.

    A protocol rather than the call itself, so the wire format does not depend on how a
    call is served (:class:`llm_health.sim.call.Call` satisfies it).
    """

    @property
    def kind(self) -> Kind: ...

    @property
    def call_id(self) -> str: ...

    @property
    def created(self) -> int: ...

    @property
    def params(self) -> Params: ...


def _envelope(reply: Reply, obj: str, choice: dict[str, object]) -> dict[str, object]:
    """The fields every completion document shares, streamed chunk or whole body."""
    return {
        "id": reply.call_id,
        "object": obj,
        "created": reply.created,
        "model": reply.params.model,
        "choices": [choice],
    }


def _chunk(reply: Reply, choice: dict[str, object]) -> dict[str, object]:
    """A streamed chunk envelope around one choice, as vLLM emits it."""
    obj = "chat.completion.chunk" if reply.kind == "chat" else "text_completion"
    return _envelope(reply, obj, choice)


def role_chunk(reply: Reply) -> dict[str, object]:
    """The first chat chunk: assistant role, empty content, no token."""
    delta = {"role": "assistant", "content": ""}
    return _chunk(reply, {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})


def token_chunk(
    reply: Reply, step: Step, offset: int, finish_reason: str | None
) -> dict[str, object]:
    """The chunk carrying one generated token (and the finish reason on the last one).

    ``offset`` is where the token starts in the generated text (completions'
    ``text_offset``).
    """
    if reply.kind == "chat":
        choice: dict[str, object] = {"index": 0, "delta": {"content": step.text}}
    else:
        choice = {"index": 0, "text": step.text}
    choice.update(
        {
            "logprobs": _logprobs(reply, [step], [offset]),
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
    )
    if reply.params.return_token_ids:
        choice["token_ids"] = [step.token_id]
    return _chunk(reply, choice)


def generated(steps: Sequence[Step], count: int) -> tuple[list[Step], list[int]]:
    """The first ``count`` tokens of the cycle ``steps`` and where each starts in the text."""
    chosen = [steps[index % len(steps)] for index in range(count)]
    offsets: list[int] = []
    position = 0
    for step in chosen:
        offsets.append(position)
        position += len(step.text)
    return chosen, offsets


def _logprobs(
    reply: Reply, steps: Sequence[Step], offsets: Sequence[int]
) -> dict[str, object] | None:
    """The choice's ``logprobs`` for ``steps`` in the API's shape, or None if not asked."""
    wanted = reply.params.logprobs
    if wanted is None:
        return None
    if reply.kind == "chat":
        return {"content": [_chat_logprob(step, wanted) for step in steps]}
    return {
        "tokens": [step.text for step in steps],
        "token_logprobs": [step.logprob for step in steps],
        # vLLM always includes the chosen token, so a dict has max(N, 1) entries here.
        "top_logprobs": [dict(step.top[: max(wanted, 1)]) for step in steps],
        "text_offset": list(offsets),
    }


def _chat_logprob(step: Step, wanted: int) -> dict[str, object]:
    """One entry of chat's ``logprobs.content``: the token and its first ``wanted`` candidates."""
    return {
        "token": step.text,
        "logprob": step.logprob,
        "bytes": list(step.text.encode("utf-8")),
        "top_logprobs": [
            {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
            for text, logprob in step.top[:wanted]
        ],
    }


def _usage(reply: Reply) -> dict[str, int]:
    """Token usage: prompt tokens approximated by whitespace words."""
    source = reply.params.prompt if reply.kind == "completions" else reply.params.messages
    prompt_tokens = max(1, _count_words(source))
    completion = reply.params.max_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion,
        "completion_tokens": completion,
    }


def _count_words(value: object) -> int:
    """Whitespace words in every string of a JSON value; token ids count one each."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(1 if isinstance(item, int) else _count_words(item) for item in value)
    if isinstance(value, dict):
        return _count_words(value.get("content"))
    return 0


def usage_chunk(reply: Reply) -> dict[str, object]:
    """The final ``stream_options.include_usage`` chunk: no choices, usage filled."""
    chunk = _chunk(reply, {})
    chunk["choices"] = []
    chunk["usage"] = _usage(reply)
    return chunk


def full_body(reply: Reply, steps: Sequence[Step]) -> dict[str, object]:
    """A non-streamed completion with every token (``max_tokens`` of the cycle ``steps``)."""
    chosen, offsets = generated(steps, reply.params.max_tokens)
    text = "".join(step.text for step in chosen)
    finish: dict[str, object] = {
        "logprobs": _logprobs(reply, chosen, offsets),
        "finish_reason": "length",
        "stop_reason": None,
    }
    if reply.params.return_token_ids:
        finish["token_ids"] = [step.token_id for step in chosen]
    if reply.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, **finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, **finish}
        obj = "text_completion"
    return {**_envelope(reply, obj, choice), "usage": _usage(reply)}


async def send_event(response: web.StreamResponse, payload: Mapping[str, object]) -> None:
    """Write one SSE ``data:`` event; raises ConnectionError if the client is gone."""
    await response.write(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")
