"""Render a shipped Envoy bootstrap (envoy-configs/*.yaml) for other ports and clusters.

Structural, not textual: the YAML is parsed, then the admin, listener and plugin (every
cluster named by an ``envoy_grpc.cluster_name``: xDS, HDS, ext_authz) addresses are
rewritten, and the EDS cluster can be cloned per wanted cluster name. Used by the demo,
the benchmarks and the tests; handy for running several gateways on one host.
"""

from __future__ import annotations

import copy
import random
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

LOOPBACK = "127.0.0.1"
XDS_CLUSTER = "llm_health_xds"
DEFAULT_EDS_CLUSTER = "llama-70b"
#: Header that selects one of several rendered EDS clusters (see ``render_bootstrap``).
CLUSTER_ROUTE_HEADER = "x-llm-cluster"
Bootstrap = dict[str, Any]
ClusterSelection = Mapping[str, Mapping[str, Any] | None] | Sequence[str]


# Ports handed out for other processes to bind come from below the kernel's ephemeral range
# (Linux default 32768-60999): a port picked here and bound a moment later by a child
# process can then not be taken meanwhile by some other socket's automatic `:0` bind.
_PICK_RANGE = (20000, 32000)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, outside the ephemeral range (see above)."""
    for _ in range(200):
        port = random.randrange(*_PICK_RANGE)
        with socket.socket() as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PICK_RANGE}")


def load_bootstrap(path: Path | str) -> Bootstrap:
    """Parse a bootstrap YAML file into a dict."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a YAML mapping")
    return data


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every mapping inside ``node`` (depth first, ``node`` itself included)."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def static_clusters(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    clusters = config.get("static_resources", {}).get("clusters", [])
    return list(clusters)


def eds_clusters(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Static clusters of type EDS."""
    return [c for c in static_clusters(config) if c.get("type") == "EDS"]


def grpc_cluster_names(config: Mapping[str, Any]) -> set[str]:
    """Clusters referenced by any ``envoy_grpc.cluster_name`` (ADS, EDS, HDS, ext_authz...):
    those point at the plugin's gRPC server."""
    names: set[str] = set()
    for node in walk(config):
        grpc = node.get("envoy_grpc")
        if isinstance(grpc, dict) and "cluster_name" in grpc:
            names.add(grpc["cluster_name"])
    return names


def listeners(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(config.get("static_resources", {}).get("listeners", []))


def routes(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every route (``match`` + ``route``) in the inline route configs of all listeners."""
    found = []
    for node in walk(listeners(config)):
        if "match" in node and isinstance(node.get("route"), dict):
            found.append(node)
    return found


def deep_merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``overrides`` into ``base`` in place: mappings merge recursively, anything else
    (lists included) replaces, and a value of ``None`` deletes the key."""
    for key, value in overrides.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _set_socket_address(holder: dict[str, Any], port: int) -> None:
    """``holder`` has an ``address`` (an envoy.config.core.v3.Address)."""
    holder["address"] = {"socket_address": {"address": LOOPBACK, "port_value": port}}


def render_bootstrap(
    src: Path | str,
    dst: Path | str,
    *,
    xds_port: int,
    listener_port: int,
    admin_port: int,
    clusters: ClusterSelection | None = None,
    initial_fetch_timeout: str | None = None,
    authz_port: int | None = None,
    extra: Callable[[Bootstrap], object] | None = None,
) -> Path:
    """Render the bootstrap ``src`` and write it to ``dst`` (returned).

    - admin → 127.0.0.1:``admin_port`` (0 is fine: :class:`EnvoyProcess` learns the real
      port from ``--admin-address-path``);
    - the first listener → 127.0.0.1:``listener_port``; any further listener → 127.0.0.1
      on a fresh free port;
    - every cluster named by an ``envoy_grpc.cluster_name`` (the plugin: xDS, and later
      HDS/ext_authz) → a single endpoint 127.0.0.1:``xds_port``;
    - ``initial_fetch_timeout`` (e.g. ``"1s"``) → set on every EDS cluster's eds_config;
    - ``authz_port``: the plugin serves ext_authz on a port of its own (``server.authz``):
      every ext_authz filter calls cluster ``llm_health_authz`` (a copy of the plugin's
      cluster it called, on 127.0.0.1:``authz_port``);
    - ``clusters``: names (or name → overrides deep-merged into that cluster, see
      :func:`deep_merge`) of the EDS clusters to have. The template is the config's EDS
      cluster ``llama-70b`` (or its only EDS cluster); the result has exactly these EDS
      clusters, in order. Routes that sent traffic to the template now send it to the
      first name, and for every name a route matching header ``x-llm-cluster: <name>`` is
      added in front (same route settings, other cluster);
    - ``extra(config)`` runs last and edits the parsed config in place (its return value
      is ignored, so ``lambda c: some_dict(c).update(...)`` is fine).
    """
    src, dst = Path(src), Path(dst)
    config = load_bootstrap(src)

    admin = config.setdefault("admin", {})
    _set_socket_address(admin, admin_port)

    for index, listener in enumerate(listeners(config)):
        _set_socket_address(listener, listener_port if index == 0 else free_port())

    plugin_clusters = grpc_cluster_names(config)
    by_name = {c.get("name"): c for c in static_clusters(config)}
    missing = plugin_clusters - by_name.keys()
    if missing:
        raise ValueError(f"{src}: envoy_grpc refers to undefined clusters {sorted(missing)}")
    if not plugin_clusters:
        raise ValueError(f"{src}: no envoy_grpc cluster found, so xds_port cannot be applied")
    for name in sorted(plugin_clusters):
        cluster = by_name[name]
        cluster["type"] = "STATIC"
        cluster["load_assignment"] = _loopback_assignment(name, xds_port)

    if initial_fetch_timeout is not None:
        for cluster in eds_clusters(config):
            eds_config = cluster.setdefault("eds_cluster_config", {}).setdefault("eds_config", {})
            eds_config["initial_fetch_timeout"] = initial_fetch_timeout

    if clusters is not None:
        _replace_eds_clusters(config, clusters, src)

    if authz_port is not None:
        _point_ext_authz_at(config, authz_port, src)

    if extra is not None:
        extra(config)

    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(yaml.safe_dump(config, sort_keys=False, default_flow_style=False))
    return dst


AUTHZ_CLUSTER = "llm_health_authz"
EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"


def _point_ext_authz_at(config: Bootstrap, port: int, src: Path) -> None:
    filters = [n for n in walk(listeners(config)) if n.get("name") == EXT_AUTHZ_FILTER]
    services = [f.get("typed_config", {}).get("grpc_service", {}) for f in filters]
    called = {s.get("envoy_grpc", {}).get("cluster_name") for s in services}
    if not filters or None in called or len(called) != 1:
        raise ValueError(f"{src}: no ext_authz filter calling one envoy_grpc cluster")
    by_name = {c.get("name"): c for c in static_clusters(config)}
    own = copy.deepcopy(by_name[called.pop()])
    own["name"] = AUTHZ_CLUSTER
    own["load_assignment"] = _loopback_assignment(AUTHZ_CLUSTER, port)
    config["static_resources"]["clusters"].append(own)
    for service in services:
        service["envoy_grpc"]["cluster_name"] = AUTHZ_CLUSTER


def _loopback_assignment(cluster: str, port: int) -> dict[str, Any]:
    """A static cluster's one endpoint: 127.0.0.1:``port``."""
    endpoint: dict[str, Any] = {}
    _set_socket_address(endpoint, port)
    return {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}]}


def _replace_eds_clusters(config: Bootstrap, spec: ClusterSelection, src: Path) -> None:
    overrides: dict[str, Mapping[str, Any]]
    if isinstance(spec, Mapping):
        overrides = {name: (value or {}) for name, value in spec.items()}
    else:
        if isinstance(spec, str):
            raise TypeError("clusters must be a sequence of names or a mapping, not a str")
        overrides = {name: {} for name in spec}
    if not overrides:
        raise ValueError("clusters must name at least one cluster")

    eds = eds_clusters(config)
    if not eds:
        raise ValueError(f"{src}: has no EDS cluster to use as a template")
    named = [c for c in eds if c.get("name") == DEFAULT_EDS_CLUSTER]
    if named:
        template = named[0]
    elif len(eds) == 1:
        template = eds[0]
    else:
        raise ValueError(f"{src}: several EDS clusters and none is {DEFAULT_EDS_CLUSTER!r}")
    template_name = template["name"]

    new_clusters = []
    for name, override in overrides.items():
        cluster = copy.deepcopy(template)
        cluster["name"] = name
        eds_cluster_config = cluster.get("eds_cluster_config", {})
        if "service_name" in eds_cluster_config:
            eds_cluster_config["service_name"] = name
        deep_merge(cluster, override)
        new_clusters.append(cluster)

    all_clusters = config["static_resources"]["clusters"]
    eds_ids = {id(c) for c in eds}
    first_eds = next(i for i, c in enumerate(all_clusters) if id(c) in eds_ids)
    kept = [c for c in all_clusters if id(c) not in eds_ids]
    config["static_resources"]["clusters"] = kept[:first_eds] + new_clusters + kept[first_eds:]

    names = list(overrides)
    for route_list in _route_lists(config):
        rebuilt = []
        for route in route_list:
            if route.get("route", {}).get("cluster") != template_name:
                rebuilt.append(route)
                continue
            for name in names:
                selected = copy.deepcopy(route)
                selected["route"]["cluster"] = name
                match = selected.setdefault("match", {})
                headers = [
                    h for h in match.get("headers", []) if h.get("name") != CLUSTER_ROUTE_HEADER
                ]
                headers.append({"name": CLUSTER_ROUTE_HEADER, "string_match": {"exact": name}})
                match["headers"] = headers
                rebuilt.append(selected)
            route["route"]["cluster"] = names[0]
            rebuilt.append(route)
        route_list[:] = rebuilt


def _route_lists(config: Mapping[str, Any]) -> Iterator[list[dict[str, Any]]]:
    for node in walk(listeners(config)):
        if "domains" in node and isinstance(node.get("routes"), list):
            yield node["routes"]
