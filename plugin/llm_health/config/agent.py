"""``llm-health agent --config FILE``: the agent's file (docs/agent.md,
docs/configuration.md "Agent"). The same ``probe:`` section as ``serve`` (api, model,
thresholds, verify, engine metrics ...) and an ``agent:`` section; nothing else. Loaded by
``config.loader`` like ``serve``'s file (file:line messages, ``${ENV}``, size limits):
``load_agent_config``.

The agent probes one endpoint, ``--engine``, as cluster ``ENGINE_CLUSTER``: what this
module builds from the file for it (its probe target, its board cluster, its engine
checks) is built the way ``serve`` builds them per cluster.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from llm_health.agent.settings import AgentSettings
from llm_health.agent.signals import stall_bound
from llm_health.config.loader import FileModel, Redact, load_file, parse_file
from llm_health.config.rules import Problem
from llm_health.config.schema import Config, ProbeSettings, secrets_of
from llm_health.core.addresses import split_address
from llm_health.core.settings import Frozen
from llm_health.engines.settings import ClusterChecks, in_force
from llm_health.model.board import ClusterSpec, EndpointSpec
from llm_health.probe.target import ProbeTarget

ENGINE_CLUSTER = "engine"
_OWN_KEYS = ("probe", "agent")
# Sections of ``serve``'s file the agent has no use for, and what it does instead.
_NOT_USED = {
    "clusters": "not used by the agent; it probes --engine",
    "server": "not used by the agent; it listens on --http",
}
_SERVE_ONLY = "not used by the agent (a section of llm-health serve's file)"


class AgentFile(Frozen):
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)

    def stall_s(self) -> float:
        """How long without a probe result the agent calls the prober stalled
        (``agent.signals.stall_bound`` of these probe settings)."""
        probe = self.probe
        return stall_bound(probe.interval, probe.timeout, probe.unhealthy_after)

    def secret_values(self) -> frozenset[str]:
        """Every secret the file holds (the probe's header values), in the forms to
        redact."""
        return secrets_of(self)

    def target(self, address: str, model: str | None = None) -> ProbeTarget:
        """The engine's probe. ``model``: the one discovered from its ``/v1/models`` when
        ``probe.model`` is unset; the served-model check then has nothing to compare, so it
        runs only for a configured ``probe.model``."""
        probe = self.probe
        if probe.model is None and model is not None:
            probe = probe.model_copy(update={"model": model, "models_path": None})
        return probe.to_target(ENGINE_CLUSTER, address, self.secret_values())

    def cluster(self, address: str) -> ClusterSpec:
        """The board's one cluster: the engine, with the probe's policy."""
        host, port = split_address(address)
        spec = EndpointSpec(address, host, port)
        return ClusterSpec(ENGINE_CLUSTER, self.probe.to_policy(), (spec,))

    def engine_checks(self) -> Mapping[str, ClusterChecks]:
        """The engine checks in force (``probe.verify``, ``probe.engine_metrics``)."""
        return {ENGINE_CLUSTER: in_force(self.probe.verify, self.probe.engine_metrics)}


def _top_level(raw: dict[Any, Any]) -> Iterator[Problem]:
    """Only ``probe`` and ``agent``: a key of ``serve``'s file says what the agent does
    instead; any other is unknown, with the nearest own key as a hint."""
    for key in raw:
        name = str(key)
        if name in _OWN_KEYS:
            continue
        if name in _NOT_USED or name in Config.model_fields:
            yield (name,), _NOT_USED.get(name, _SERVE_ONLY)
            continue
        close = difflib.get_close_matches(name, _OWN_KEYS, n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        yield (name,), f"unknown key{hint}; the agent's file takes probe and agent"


def _agent_rules(file: AgentFile, _redact: Redact) -> Iterator[Problem]:
    if file.probe.scheme != "http":
        yield ("probe", "scheme"), "the agent probes --engine over http; remove probe.scheme"


AGENT_FILE = FileModel(
    AgentFile,
    "the file must be a YAML mapping with the sections probe and agent",
    before=_top_level,
    after=_agent_rules,
    empty=True,
)


def load_agent_config(path: str | Path, environ: Mapping[str, str] | None = None) -> AgentFile:
    """Read, expand ``${ENV}`` and validate the agent's file. Raises ConfigError."""
    return load_file(path, AGENT_FILE, environ)


def parse_agent_config(text: str, source: str, environ: Mapping[str, str]) -> AgentFile:
    return parse_file(text, source, environ, AGENT_FILE)
