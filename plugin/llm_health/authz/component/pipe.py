"""The messages between the runtime and its admission process (docs/design.md §16.9), in
the frames of ``probe.wire`` (trusted pickles: both ends are this program, and the child
is one the runtime started itself over its own pipes).

  runtime -> child   ("init", ChildInit)                 once, first: where to listen, the
                                                         token and TLS bytes, the logging
                     ("view", revision, facts, settings) each new admission view, whole
                                                         (``ClusterFacts``, ``AuthzConfig``)
  child -> runtime   ("ready", port)                     serving (port: 0 on a Unix socket)
                     ("failed", error)                   cannot serve; it exits
                     ("counters", state, rebuilds, rejected)  every COUNTERS_EVERY_S
                                                         (``CountersState``, view rebuilds,
                                                         token rejections), and on exit
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_health.servers.auth import PortSecrets

MODULE = "llm_health.authz.component.child"
COUNTERS_EVERY_S = 0.25  # how stale /status and /metrics may be


@dataclass(frozen=True, slots=True)
class ChildInit:
    listen: str
    secrets: PortSecrets  # its repr shows none of them
    log_format: str = "text"
    log_level: str = "info"
