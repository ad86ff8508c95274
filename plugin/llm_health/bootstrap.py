"""Render a shipped Envoy bootstrap (envoy-configs/*.yaml) with other ports and clusters.

Structural, not textual: the YAML is parsed, the admin / listener / plugin (xDS) addresses
are rewritten, and the EDS cluster is cloned per wanted cluster name. Used by the demo and
the benchmarks; handy for users who run several gateways on one host.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

XDS_CLUSTER = "llm_health_xds"


def render_bootstrap(
    source: Path,
    *,
    admin_port: int,
    listener_port: int,
    xds_port: int,
    clusters: Sequence[str] | None = None,
    host: str = "127.0.0.1",
) -> dict[str, Any]:
    """The bootstrap from ``source`` with every address on ``host`` and the given ports.

    ``clusters``: names of the EDS clusters wanted; the file's first EDS cluster is the
    template, and the first route's cluster is pointed at the first name.
    """
    config: dict[str, Any] = yaml.safe_load(source.read_text(encoding="utf-8"))
    _set_socket(config["admin"]["address"], host, admin_port)
    for listener in config["static_resources"].get("listeners", []):
        _set_socket(listener["address"], host, listener_port)
    statics = config["static_resources"]["clusters"]
    for cluster in statics:
        if cluster["name"] == XDS_CLUSTER:
            _set_endpoint_port(cluster, host, xds_port)
    if clusters:
        config["static_resources"]["clusters"] = _clone_eds(statics, clusters)
        _point_routes(config, clusters[0])
    return config


def write_bootstrap(config: dict[str, Any], destination: Path) -> Path:
    destination.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return destination


def _set_socket(address: dict[str, Any], host: str, port: int) -> None:
    address["socket_address"]["address"] = host
    address["socket_address"]["port_value"] = port


def _set_endpoint_port(cluster: dict[str, Any], host: str, port: int) -> None:
    for locality in cluster["load_assignment"]["endpoints"]:
        for lb_endpoint in locality["lb_endpoints"]:
            _set_socket(lb_endpoint["endpoint"]["address"], host, port)


def _clone_eds(statics: list[dict[str, Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    others = [c for c in statics if c.get("type") != "EDS"]
    template = next(c for c in statics if c.get("type") == "EDS")
    clones = []
    for name in names:
        clone = copy.deepcopy(template)
        clone["name"] = name
        clone.get("eds_cluster_config", {}).pop("service_name", None)
        clones.append(clone)
    return others + clones


def _point_routes(config: dict[str, Any], cluster: str) -> None:
    for listener in config["static_resources"].get("listeners", []):
        for chain in listener.get("filter_chains", []):
            for network_filter in chain.get("filters", []):
                route_config = network_filter.get("typed_config", {}).get("route_config", {})
                for vhost in route_config.get("virtual_hosts", []):
                    for route in vhost.get("routes", []):
                        if "cluster" in route.get("route", {}):
                            route["route"]["cluster"] = cluster
