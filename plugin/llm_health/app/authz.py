"""The ext_authz component: registers ``Authorization/Check`` and reports its counters.

Settings follow config reloads: the gate asks for them on every check and they are
rebuilt only when the ``config`` getter returns a new object. No background task.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import grpc

from llm_health.authz import AuthzCounters, AuthzSettings, Gate, ProblemLog
from llm_health.config import AuthzConfig
from llm_health.core.control import SnapshotSource
from llm_health.servers.authz import add_authz_servicer


class AuthzComponent:
    name = "authz"

    def __init__(self, published: SnapshotSource, config: Callable[[], AuthzConfig]) -> None:
        self._config = config
        self._seen: AuthzConfig | None = None
        self._settings = AuthzSettings()
        self.counters = AuthzCounters()
        self.problems = ProblemLog()
        self.gate = Gate(published.current, self.settings)

    def settings(self) -> AuthzSettings:
        config = self._config()
        if config is not self._seen:
            self._seen, self._settings = config, config.to_settings()
        return self._settings

    def register(self, server: grpc.aio.Server) -> None:
        add_authz_servicer(server, self.gate, self.counters, self.problems)

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        return []

    def status(self) -> dict[str, Any]:
        settings = self.settings()
        return {
            "enabled": settings.enabled,
            "probe_header": settings.probe_header,
            "shed_below": settings.shed_below,
            "view_rebuilds": self.gate.rebuilds,
            **self.counters.as_dict(),
        }
