"""The one exception tree of llm-health.

    LLMHealthError
    ├── ConfigError          bad configuration (file, field, value); carries every message
    ├── DurationError        a duration string that does not parse (ValueError too)
    └── ProtocolError        a peer (engine, Envoy) sent something we cannot use

Lower-layer errors are mapped at the boundary: ``raise ConfigError(...) from exc``.
"""

from __future__ import annotations


class LLMHealthError(Exception):
    """Base of every error llm-health raises on purpose."""


class ConfigError(LLMHealthError):
    """Invalid configuration. ``messages`` holds one line per problem, each naming the field."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


class DurationError(LLMHealthError, ValueError):
    """A duration string such as ``"80x"`` that is not ``<number><unit>``."""


class ProtocolError(LLMHealthError):
    """A peer sent data that violates the protocol we expect from it."""
