"""Shared pytest setup."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest
from hypothesis import settings

from tests import envoy_harness

# CI runs hypothesis derandomized: the same examples every run, so a red CI is always
# reproducible (and never a lucky draw). Locally the default random search keeps exploring.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Tell the Envoy harness which test runs (setup, call and teardown) and whether it
    has the ``envoy`` marker: running Envoy from an unmarked test fails it (see
    :func:`tests.envoy_harness.envoy_binary`)."""
    envoy_harness.set_current_test(item.nodeid, item.get_closest_marker("envoy") is not None)
    try:
        return (yield)
    finally:
        envoy_harness.set_current_test(None)
