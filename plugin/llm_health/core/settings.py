"""Building blocks of every settings section (docs/design.md §6): the frozen base model,
ASCII-only numbers, durations, URL paths, header maps and bearer tokens. Each feature's section model
(``<feature>/settings.py``) is built from these; ``config.schema`` composes the sections.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
)

from llm_health.model.durations import parse_duration

MAX_HEADERS = 64  # per probe or webhook
MAX_HEADER_VALUE = 8_192

_ASCII_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")


def _ascii_int(value: Any) -> Any:
    """Integers are ASCII digits: pydantic (and int()) would also take "8_0" or a bool;
    other scripts' digits ("٨٠") must never become a number."""
    if isinstance(value, bool) or (isinstance(value, str) and not _ASCII_INTEGER.fullmatch(value)):
        raise ValueError(f"{value!r} is not an integer (digits 0-9)")
    return value


def _ascii_float(value: Any) -> Any:
    if isinstance(value, bool) or (isinstance(value, str) and not value.isascii()):
        raise ValueError(f"{value!r} is not a number (digits 0-9)")
    return value


Int = Annotated[int, BeforeValidator(_ascii_int)]
Number = Annotated[float, BeforeValidator(_ascii_float)]


def _duration(value: Any, info: ValidationInfo) -> float:
    """A duration string from the file; already-parsed seconds only when merging models."""
    if info.context == MERGING and isinstance(value, float):
        return value
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f'{value!r} is not a duration: write it as a string, e.g. "800ms"')
    if not value.isascii():  # parse_duration's \d would read "٨٠٠ms" as 800 ms
        raise ValueError(f'"{value}" is not a duration (use e.g. "800ms", "1s", "5m")')
    return parse_duration(value)


def _absolute_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f'"{value}" must start with "/"')
    if any(c.isspace() for c in value):
        raise ValueError(f'"{value}": a URL path cannot contain white space')
    return value


# A type, not a field_validator, so that the per-cluster overrides (ProbeOverrides, built
# from these annotations) get exactly the same check as the top-level probe section.
UrlPath = Annotated[str, AfterValidator(_absolute_path), Field(max_length=2000)]
# RFC 9110 §5.6.2 token: what an HTTP header name may be.
HeaderToken = Annotated[
    str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
]
HeaderValue = Annotated[SecretStr, Field(max_length=MAX_HEADER_VALUE)]
Headers = Annotated[dict[HeaderToken, HeaderValue], Field(max_length=MAX_HEADERS)]


MERGING = "merging parsed settings"  # validation context: values are already parsed
Duration = Annotated[float, BeforeValidator(_duration), Field(gt=0)]

MIN_TOKEN_LENGTH = 16


def _long_enough(value: SecretStr) -> SecretStr:
    if len(value.get_secret_value()) < MIN_TOKEN_LENGTH:
        raise ValueError("must be at least 16 characters (use a random string)")
    return value


def _header_safe(value: SecretStr) -> SecretStr:
    secret = value.get_secret_value()
    if not secret.isascii() or not secret.isprintable() or " " in secret:
        raise ValueError("must be printable ASCII without spaces (it is sent as a header)")
    return value


# A bearer token (``server.token``, ``admin.token``): sent as gRPC metadata
# (``authorization: Bearer <token>``), so it must be a valid header value; checked in this
# order, the length first.
Token = Annotated[SecretStr, AfterValidator(_long_enough), AfterValidator(_header_safe)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)


def regex(value: str | None) -> str | None:
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f'"{value}" is not a regular expression: {exc}') from None
    return value
