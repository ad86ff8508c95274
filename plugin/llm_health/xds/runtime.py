"""RTDS: one runtime layer for Envoy (``envoy.service.runtime.v3.RuntimeDiscoveryService``).

The layer's values are worked out by whoever registers the service (a function of the
health snapshot: ``authz.native.shed_layer``, docs/admission.md "Admission inside Envoy");
this module only keeps the stream's rules. RTDS is SotW-only and its resource is
``envoy.service.runtime.v3.Runtime`` (``name``: the layer's ``rtds_layer.name`` in Envoy's
bootstrap, ``layer``: a ``Struct`` of runtime keys). One layer is served, named
``LAYER_NAME``; a request for other names gets nothing for them (counted, logged once).

The ACK/NACK, nonce and version rules are EDS's (``protocol.SotwTracker``); the version
is a hash of the layer's sorted values, so equal layers are equal versions across
streams and restarts, and a NACKed layer is not resent until it changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from llm_health.xds.protocol import Plan, SotwTracker, interest

LAYER_NAME = "llm_health"
RUNTIME_TYPE_URL = "type.googleapis.com/envoy.service.runtime.v3.Runtime"

Layer = Mapping[str, float]


def layer_version(layer: Layer) -> str:
    """An opaque version for a layer: a hash of its sorted keys and values."""
    text = json.dumps(sorted(layer.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class LayerPush:
    """One RTDS response: the whole layer."""

    nonce: str
    version: str
    name: str
    layer: Layer


class LayerState(SotwTracker):
    """State of one RTDS stream: pushes ``LAYER_NAME`` while it is requested (by name or
    wildcard) and its content is not what the client has, has in flight, or refused."""

    def plan(self, layer: Layer) -> Plan[LayerPush]:
        """The response to send now, if any; records it as sent."""
        if not self.started:
            return Plan(None)
        names = interest(self.subscription, (LAYER_NAME,))
        unknown = self.unreported(sorted(names - {LAYER_NAME}))
        version = layer_version(layer)
        if LAYER_NAME not in names or not self.needs(version):
            return Plan(None, unknown)
        push = LayerPush(self.record(version), version, LAYER_NAME, dict(layer))
        return Plan(push, unknown)
