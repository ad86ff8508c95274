"""The YAML configuration (docs/design.md §6).

``schema``: the sections and their rules; ``loader``: file -> validated ``Config``;
``messages``: problems in the file's own words; ``addresses``: host:port parsing.
"""

from llm_health.config.loader import load_config, parse_config
from llm_health.config.schema import (
    ClusterConfig,
    Config,
    EndpointConfig,
    ProbeSettings,
    ServerConfig,
    XdsConfig,
)
from llm_health.core.addresses import is_local_bind, split_address

__all__ = [
    "ClusterConfig",
    "Config",
    "EndpointConfig",
    "ProbeSettings",
    "ServerConfig",
    "XdsConfig",
    "is_local_bind",
    "load_config",
    "parse_config",
    "split_address",
]
