"""Real-engine tests: llama.cpp's ``llama-server`` serving a tiny random-weight model.

They need the engine build (``tests/engine/build-llama-server.sh``, 10-15 min once), so they
run under ``make test-engine``, which builds (cached), exports ``$LLM_HEALTH_ENGINE`` and
generates the models; ``make test`` leaves this directory out. Without
``$LLM_HEALTH_ENGINE`` every test here is skipped, naming the target; with it set, a
missing binary is an error, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.engine.llama import (
    DEFAULT_ALIAS,
    ENGINE_ENV,
    LlamaServer,
    StartServer,
    server_binary,
)
from tests.engine.make_model import ensure_model


@pytest.fixture(scope="session")
def engine_dir() -> Path:
    value = os.environ.get(ENGINE_ENV)
    if not value:
        pytest.skip(f"real-engine test: run `make test-engine` (${ENGINE_ENV} is not set)")
    engine = Path(value).resolve()
    binary = server_binary(engine)
    if not binary.exists():
        pytest.fail(f"${ENGINE_ENV}={value} but {binary} is missing: run `make test-engine`")
    return engine


@pytest.fixture(autouse=True)
def _needs_engine(engine_dir: Path) -> None:
    """Every test in this directory: skipped without ``$LLM_HEALTH_ENGINE``."""


@pytest.fixture(scope="session")
def tiny_model(engine_dir: Path) -> Callable[[int], Path]:
    """seed -> the cached model file (generated on first use, ~10 s)."""
    return lambda seed: ensure_model(engine_dir, seed)


@pytest.fixture
def llama_server(
    engine_dir: Path, tiny_model: Callable[[int], Path], tmp_path: Path
) -> Iterator[StartServer]:
    """Factory: ``llama_server(seed=1, alias=..., parallel=2, ...)`` starts a server and
    waits for ``/health`` 200; every server it started is stopped after the test."""
    started: list[LlamaServer] = []

    def start(
        seed: int = 1,
        *,
        alias: str = DEFAULT_ALIAS,
        ctx: int = 512,
        parallel: int = 2,
        port: int = 0,
        extra: tuple[str, ...] = (),
    ) -> LlamaServer:
        workdir = tmp_path / f"llama-{len(started)}"
        server = LlamaServer(
            workdir,
            engine_dir,
            tiny_model(seed),
            alias=alias,
            ctx=ctx,
            parallel=parallel,
            port=port,
            extra=extra,
        )
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
