"""Builders of the plain metric families a component declares (``core.component.
MetricsSource``): one series, no labels. Labelled families are built with
prometheus_client's ``CounterMetricFamily`` / ``GaugeMetricFamily`` directly.

Names are written out in full as Prometheus exposes them (a counter's ends in ``_total``)
so that a dashboard's query and its source can be found with one grep.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric


def counter(name: str, documentation: str, value: float) -> Metric:
    """A counter exposed as ``name`` (which ends in ``_total``)."""
    if not name.endswith("_total"):
        raise ValueError(f"a counter's name ends in _total: {name}")
    return CounterMetricFamily(name, documentation, value=value)


def gauge(name: str, documentation: str, value: float) -> Metric:
    """A gauge; a bool is 1 or 0."""
    return GaugeMetricFamily(name, documentation, value=float(value))
