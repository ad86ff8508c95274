"""The container image, built by ``make image`` (deploy/build-image.sh), checked by running
it: ``make test-image`` builds it, then exports ``$LLM_HEALTH_IMAGE`` (its reference) and
``$LLM_HEALTH_IMAGE_TOOL`` (docker, podman or buildah) for these tests. ``make test``
leaves this directory out; without ``$LLM_HEALTH_IMAGE`` every test here is skipped,
naming the target.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.image.runner import Image

IMAGE_ENV = "LLM_HEALTH_IMAGE"
TOOL_ENV = "LLM_HEALTH_IMAGE_TOOL"
SIZES: dict[str, str] = {}  # image ref -> size, printed at the end of the run


@pytest.fixture(scope="session")
def image() -> Iterator[Image]:
    ref = os.environ.get(IMAGE_ENV)
    if not ref:
        pytest.skip(f"container image test: run `make test-image` (${IMAGE_ENV} is not set)")
    built = Image(os.environ.get(TOOL_ENV) or "buildah", ref)
    SIZES[ref] = built.size()
    try:
        yield built
    finally:
        built.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for ref, size in SIZES.items():
        terminalreporter.write_line(f"image {ref}: {size}")
