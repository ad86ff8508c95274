"""Gate: answers checks from the latest published snapshot and the current settings.

Call from the one event loop that owns the SnapshotHub, or from one thread at a time
(``server.authz``'s threads take the component's lock: docs/design.md §16.9); the
snapshot getter returns the hub's current object, replaced whole. A check costs a dict
lookup and a few comparisons; the view is rebuilt only when the snapshot revision or the
settings object changes (the first check after a push or a config reload pays for it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from llm_health.authz.decide import decide
from llm_health.authz.decision import AdmissionRequest, Decision
from llm_health.authz.settings import AuthzConfig
from llm_health.authz.view import AdmissionView, ClusterFacts, build_view, view_from_facts
from llm_health.model.board import HealthSnapshot


class Checker(Protocol):
    """What the ext_authz adapter asks (``Gate``, ``PushedGate``)."""

    def check(self, request: AdmissionRequest) -> Decision: ...


class Gate:
    def __init__(
        self,
        snapshot: Callable[[], HealthSnapshot],
        settings: Callable[[], AuthzConfig],
    ) -> None:
        self._snapshot = snapshot
        self._settings = settings
        self._view: AdmissionView | None = None
        self._view_settings: AuthzConfig | None = None
        self.rebuilds = 0

    def view(self) -> tuple[AdmissionView, AuthzConfig]:
        """The view for the current snapshot and settings (cached per revision)."""
        snapshot, settings = self._snapshot(), self._settings()
        view = self._view
        if (
            view is None
            or view.revision != snapshot.revision
            or self._view_settings is not settings
        ):
            view = self._view = build_view(snapshot, settings)
            self._view_settings = settings
            self.rebuilds += 1
        return view, settings

    def check(self, request: AdmissionRequest) -> Decision:
        view, settings = self.view()
        return decide(request, view, settings)


class PushedGate:
    """A gate whose view is handed to it (``update``), not read from a hub: the admission
    process's (docs/design.md §16.9), fed by the runtime. Until the first ``update`` it
    has no view and ``check`` raises (the process serves only after its first view)."""

    def __init__(self) -> None:
        self._view: AdmissionView | None = None
        self._settings: AuthzConfig | None = None
        self.rebuilds = 0

    @property
    def has_view(self) -> bool:
        return self._view is not None

    def update(self, revision: int, facts: tuple[ClusterFacts, ...], settings: AuthzConfig) -> None:
        """Replace the view whole: a check sees the old one or the new one, never a mix."""
        view = view_from_facts(revision, facts, settings)
        self._view, self._settings = view, settings
        self.rebuilds += 1

    def check(self, request: AdmissionRequest) -> Decision:
        view, settings = self._view, self._settings
        if view is None or settings is None:
            raise RuntimeError("no admission view yet")
        return decide(request, view, settings)
