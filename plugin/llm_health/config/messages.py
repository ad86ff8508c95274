"""Config problems in the file's own words: "<file>:<line> <field path>: <message>".

Every message leaves through :func:`finish`: values that came from the environment are
shown as their ``${NAME}`` reference (they may be secrets), non-printable characters are
escaped (one line, nothing a terminal interprets), long input is cut, and a file gets at
most ``MAX_MESSAGES`` lines.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from llm_health.admin.settings import AdminConfig
from llm_health.agent.settings import AgentSettings
from llm_health.alerts.settings import AlertsConfig, WebhookConfig
from llm_health.authz.settings import AuthzConfig
from llm_health.config.schema import (
    ClusterConfig,
    Config,
    EndpointConfig,
    ProbeSettings,
    ServerConfig,
    ServerTlsConfig,
    XdsConfig,
)
from llm_health.hds.settings import HdsConfig
from llm_health.model.redact import escape

ConfigPath = tuple[str | int, ...]  # keys and list indexes from the top of the file

MAX_MESSAGES = 50  # per file; then "... and N more problems"
MAX_INPUT_CHARS = 120  # a quoted value in a message is cut here
MAX_MESSAGE_CHARS = 400  # a whole message line is cut (in the middle) beyond this
_HEAD_CHARS, _TAIL_CHARS = 280, 100


class Redactor:
    """Replaces every value substituted from the environment (3 characters or more,
    longest first) by its ``${NAME}`` reference: as it is, stripped (pydantic strips
    strings) and as repr() writes it (quotes and backslashes escaped). Immutable."""

    def __init__(self, substituted: Mapping[str, str]) -> None:
        pairs: dict[str, str] = {}
        for value, ref in substituted.items():
            for form in (value, value.strip()):
                for shown in (form, repr(form)[1:-1]):
                    if len(shown) >= 3:
                        pairs.setdefault(shown, ref)
        self._pairs = tuple(sorted(pairs.items(), key=lambda pair: -len(pair[0])))

    def __call__(self, text: str) -> str:
        for value, ref in self._pairs:
            if value in text:
                text = text.replace(value, ref)
        return text


NO_SECRETS = Redactor({})


def finish(messages: list[str], redact: Callable[[str], str] = NO_SECRETS) -> list[str]:
    """The messages as they may be shown: redacted, escaped, one line each, bounded."""
    shown = [one_line(redact(m)) for m in messages[:MAX_MESSAGES]]
    if len(messages) > MAX_MESSAGES:
        shown.append(f"... and {len(messages) - MAX_MESSAGES} more problems")
    return shown


def one_line(text: str) -> str:
    """Cut to MAX_MESSAGE_CHARS (keeping the head and the tail, where the explanation
    is) and escape every non-printable character the way repr() does. Only ever call it
    on text already redacted: a cut must never leave part of a secret behind."""
    return _cut(escape(_cut(text, MAX_MESSAGE_CHARS)), MAX_MESSAGE_CHARS)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:_HEAD_CHARS]}…{text[-_TAIL_CHARS:]}"


def quoted(value: Any, redact: Callable[[str], str] = NO_SECRETS) -> str:
    """repr() of a value from the file, redacted first, then cut to MAX_INPUT_CHARS."""
    if isinstance(value, str):
        value = redact(value)
        if len(value) > MAX_INPUT_CHARS:
            return repr(value[:MAX_INPUT_CHARS]) + "…"
    return repr(value)


def format_errors(
    exc: ValidationError,
    lines: dict[ConfigPath, int],
    source: str,
    redact: Callable[[str], str] = NO_SECRETS,
) -> list[str]:
    errors = exc.errors()
    paths: list[ConfigPath] = [tuple(error["loc"]) for error in errors]
    messages = []
    for error, path in zip(errors, paths, strict=True):
        if error["type"] == "too_short" and _has_child_error(path, paths):
            continue  # pydantic's echo of a failed item ("at least 1 item ... not 0")
        text = describe(error, redact)
        messages.append(f"{source}:{line_of(lines, path)} {dotted(path)}: {text}")
    return messages


def _has_child_error(path: ConfigPath, paths: list[ConfigPath]) -> bool:
    return any(len(other) > len(path) and other[: len(path)] == path for other in paths)


def describe(error: Any, redact: Callable[[str], str] = NO_SECRETS) -> str:
    """Pydantic's error in the words of this config file. (A value_error's text comes
    from our validators and may quote the whole value: ``finish`` redacts and cuts it.)"""
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        return _unknown_key(error["loc"])
    if kind == "missing":
        return "required key is missing"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    if kind == "literal_error":
        return f"{quoted(error['input'], redact)} is not one of {error['ctx']['expected']}"
    if _is_scalar(error.get("input")):
        return f"{quoted(error['input'], redact)}: {message}"
    return str(message)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


def _unknown_key(loc: tuple[Any, ...]) -> str:
    key = str(loc[-1])
    known = _known_keys(loc[:-1])
    close = difflib.get_close_matches(key, known, n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    return f"unknown key{hint}"


def _known_keys(parent: tuple[Any, ...]) -> list[str]:
    names = [p for p in parent if isinstance(p, str)]
    last = names[-1] if names else ""
    models: dict[str, type[BaseModel]] = {
        "": Config,
        "server": ServerConfig,
        "tls": ServerTlsConfig,
        "probe": ProbeSettings,
        "xds": XdsConfig,
        "alerts": AlertsConfig,
        "admin": AdminConfig,
        "authz": AuthzConfig,
        "hds": HdsConfig,
        "webhooks": WebhookConfig,
        "clusters": ClusterConfig,
        "endpoints": EndpointConfig,
        "agent": AgentSettings,  # llm-health agent's file (config.agent)
    }
    model = models.get(last, Config)
    return list(model.model_fields)


def line_of(lines: dict[ConfigPath, int], path: ConfigPath) -> int:
    """Line of the deepest part of ``path`` present in the file (1 when none is)."""
    for depth in range(len(path), -1, -1):
        if path[:depth] in lines:
            return lines[path[:depth]]
    return 1


def dotted(path: ConfigPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"
