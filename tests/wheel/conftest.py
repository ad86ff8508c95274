"""The wheel, built and installed into a fresh venv: run by ``make test-image``, which sets
``$LLM_HEALTH_TEST_WHEEL`` (building and installing need PyPI and take a minute or two, so
``make test`` leaves this directory out). Without it every test here is skipped, naming
the target."""

from __future__ import annotations

import os

import pytest

from tests.wheel.dist import Built, build

WHEEL_ENV = "LLM_HEALTH_TEST_WHEEL"


@pytest.fixture(scope="session", autouse=True)
def _needs_the_target() -> None:
    if not os.environ.get(WHEEL_ENV):
        pytest.skip(f"wheel test: run `make test-image` (${WHEEL_ENV} is not set)")


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sdist and wheel, built once for every test here."""
    return build(tmp_path_factory.mktemp("dist"))
