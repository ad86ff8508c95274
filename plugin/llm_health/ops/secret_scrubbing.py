"""The last line of defence for secrets: every log record, every /status document, every
alert webhook body and every admin API answer is scrubbed of every configured secret value
(``Config.secret_values``; the rules are ``model.redact.redact_secrets``: any letter case,
and the start of a cut secret).

Sources redact first (the probe removes secrets from backend text before it becomes a
``detail`` or an ``Answer``, the served-model check from the model ids; config messages
show ``${NAME}`` instead of values); this catches whatever a future code path forgets.
One ``Secrets`` is shared by the runtime and the components that send text out
(``app.assemble``); its set follows config reloads.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from llm_health.model.redact import redact_secrets

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class Secrets:
    """The current secret values (replaced whole on reload; read on every use)."""

    def __init__(self, values: frozenset[str] = frozenset()) -> None:
        self.values = values

    def redact(self, text: str) -> str:
        """``text`` with every secret redacted."""
        return redact_secrets(text, self.values)

    def scrub(self, value: Any) -> Any:
        """``value`` with every string in it redacted (dicts and lists walked)."""
        if not self.values:
            return value
        if isinstance(value, str):
            return redact_secrets(value, self.values)
        if isinstance(value, Mapping):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(v) for v in value]
        return value


class SecretFilter(logging.Filter):
    """Redacts a record's message and its extra string fields (a handler filter: it sees
    the records of every logger that reaches the handler)."""

    def __init__(self, secrets: Secrets) -> None:
        super().__init__()
        self._secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._secrets.values:
            return True
        message = record.getMessage()
        clean = self._secrets.scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        for key, value in list(record.__dict__.items()):
            if key not in _STANDARD and isinstance(value, str | Mapping | list | tuple):
                record.__dict__[key] = self._secrets.scrub(value)
        return True


@contextmanager
def scrubbed_logs(secrets: Secrets) -> Iterator[None]:
    """Install the filter on the root logger's handlers for the duration."""
    handlers = list(logging.getLogger().handlers)
    added = SecretFilter(secrets)
    for handler in handlers:
        handler.addFilter(added)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(added)
