"""What one streamed event means for TTFT (pure). docs/design.md §2: only an event that carries a
generated token (text, ``delta.content``, reasoning, a tool call, or a finish) counts; the
chat ``{"role": "assistant"}`` delta that servers flush before any compute does not."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

import orjson


class EventKind(enum.Enum):
    TOKEN = "token"
    NO_TOKEN = "no_token"
    DONE = "done"
    ERROR = "error"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class StreamEvent:
    kind: EventKind
    message: str = ""


# The events that carry no text: made once (one is made for every probe).
TOKEN_EVENT = StreamEvent(EventKind.TOKEN)
NO_TOKEN_EVENT = StreamEvent(EventKind.NO_TOKEN)
DONE_EVENT = StreamEvent(EventKind.DONE)


def interpret(payload: str, api: str) -> StreamEvent:
    """Classify one SSE ``data`` payload for ``api`` (openai-completions | openai-chat)."""
    if payload.strip() == "[DONE]":
        return DONE_EVENT
    try:
        event = loads(payload)
    except ValueError:
        return StreamEvent(EventKind.MALFORMED, f"not JSON: {_clip(payload)}")
    if not isinstance(event, dict):
        return StreamEvent(EventKind.MALFORMED, f"not a JSON object: {_clip(payload)}")
    error = _error_message(event)
    if error is not None:
        return StreamEvent(EventKind.ERROR, error)
    return _choice_event(event.get("choices"), api)


def loads(payload: str) -> Any:
    """``json.loads``, by orjson where it can: every probe decodes at least one event,
    and orjson decodes an engine's one-token event in a fraction of the stdlib's time.
    What orjson refuses the stdlib reads as before (NaN,
    Infinity, a lone surrogate: an engine in trouble may send them); the one difference
    left, an integer beyond 64 bits read as a float, changes no verdict."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)


def error_message_from_body(body: str) -> str:
    """The engine's error message from a JSON error body, else the clipped raw body."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return _clip(body)
    message = _error_message(parsed) if isinstance(parsed, dict) else None
    return message if message is not None else _clip(body)


def _error_message(event: dict[str, Any]) -> str | None:
    """OpenAI style {"error": {...}} or vLLM style {"object": "error", "message": ...}."""
    error = event.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)
    if isinstance(error, str):
        return error
    if event.get("object") == "error":
        return str(event.get("message", "error"))
    return None


def _choice_event(choices: Any, api: str) -> StreamEvent:
    if not isinstance(choices, list):
        return NO_TOKEN_EVENT  # e.g. a usage-only chunk
    for choice in choices:
        if isinstance(choice, dict) and _carries_token(choice, api):
            return TOKEN_EVENT
    return NO_TOKEN_EVENT


def _carries_token(choice: dict[str, Any], api: str) -> bool:
    if choice.get("finish_reason") is not None:
        return True
    if api == "openai-chat":
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        keys = ("content", "reasoning_content", "reasoning", "tool_calls")
        return any(delta.get(key) for key in keys)
    return bool(choice.get("text"))


def _clip(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"
