"""One builder for the plugin configs that tests run with.

Most tests need the same boilerplate: the gRPC and HTTP servers on free loopback ports,
a ``probe:`` section and a cluster or two of endpoints. :func:`plugin_settings` builds
that as a dict (what :class:`tests.processes.PluginProcess` writes to a file) and
:func:`plugin_yaml` as YAML text (what :meth:`tests.runtime.Running.from_config` parses).
A test whose subject IS the config text (a hostile file, a line number in an error, a
shipped example) keeps its text inline instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import yaml

from tests.ports import free_port

DEFAULT_CLUSTER = "llama"


class HasAddress(Protocol):
    """A simulator (``SimProcess``) or anything else with a ``host:port`` address."""

    @property
    def address(self) -> str: ...


Endpoint = str | Mapping[str, Any] | HasAddress
Endpoints = Iterable[Endpoint]


def endpoint(item: Endpoint) -> dict[str, Any]:
    """``{"address": ...}`` for an address or a simulator; a mapping is kept as it is."""
    if isinstance(item, str):
        return {"address": item}
    if isinstance(item, Mapping):
        return dict(item)
    return {"address": item.address}


def plugin_settings(
    endpoints: Endpoints | Mapping[str, Endpoints],
    *,
    cluster: str = DEFAULT_CLUSTER,
    cluster_keys: Mapping[str, Any] | None = None,
    listen: bool = True,
    **sections: Any,
) -> dict[str, Any]:
    """A config as a dict.

    - ``endpoints``: the endpoints of one cluster named ``cluster``, or a mapping of
      cluster name to endpoints for several clusters (in that order);
    - ``cluster_keys``: more keys of every cluster (``model``, ``probe``, ``discovery``);
    - ``listen``: put ``server.grpc`` and ``server.http`` on free 127.0.0.1 ports (other
      ``server`` keys given in ``sections`` are kept);
    - ``sections``: top-level sections as they appear in the file (``probe={...}``,
      ``xds={...}``, ``alerts={...}``); ``None`` values are left out.
    """
    by_cluster = endpoints if isinstance(endpoints, Mapping) else {cluster: endpoints}
    settings: dict[str, Any] = {}
    if listen:
        ports = {"grpc": f"127.0.0.1:{free_port()}", "http": f"127.0.0.1:{free_port()}"}
        settings["server"] = {**ports, **(sections.pop("server", None) or {})}
    settings.update((key, value) for key, value in sections.items() if value is not None)
    settings["clusters"] = [
        {"name": name, **(cluster_keys or {}), "endpoints": [endpoint(e) for e in members]}
        for name, members in by_cluster.items()
    ]
    return settings


def plugin_yaml(
    endpoints: Endpoints | Mapping[str, Endpoints],
    *,
    cluster: str = DEFAULT_CLUSTER,
    cluster_keys: Mapping[str, Any] | None = None,
    listen: bool = True,
    **sections: Any,
) -> str:
    """:func:`plugin_settings` as YAML text."""
    settings = plugin_settings(
        endpoints, cluster=cluster, cluster_keys=cluster_keys, listen=listen, **sections
    )
    return yaml.safe_dump(settings, sort_keys=False)
