"""Real-engine tests: llama.cpp's ``llama-server`` and vLLM, each serving a tiny
random-weight model.

They need the engine builds (``tests/engine/build-llama-server.sh``, 10-15 min once;
``tests/engine/install-vllm.sh``, about 70 s once), so they run under ``make test-engine``,
which builds and installs (cached), makes the models and exports ``$LLM_HEALTH_ENGINE``,
``$LLM_HEALTH_VLLM`` and ``$LLM_HEALTH_VLLM_MODEL``; ``make test`` leaves this directory
out. Without its variable each engine's tests are skipped, naming the target (the vLLM
ones are the files named ``test_vllm_*``); with it set, a missing binary is an error,
never a skip.
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
from tests.engine.vllm import MODEL_ENV, VENV_ENV, StartVllm, VllmServer, server_python


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
def _needs_engine(request: pytest.FixtureRequest) -> None:
    """Every test in this directory: skipped without its engine's variable
    (``$LLM_HEALTH_VLLM`` for the ``test_vllm_*`` files, ``$LLM_HEALTH_ENGINE`` else)."""
    if request.path.name.startswith("test_vllm_"):
        request.getfixturevalue("vllm_venv")
    else:
        request.getfixturevalue("engine_dir")


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    value = os.environ.get(VENV_ENV)
    if not value:
        pytest.skip(f"real-engine test: run `make test-engine` (${VENV_ENV} is not set)")
    venv = Path(value).resolve()
    if not server_python(venv).exists():
        pytest.fail(f"${VENV_ENV}={value} but {server_python(venv)} is missing")
    return venv


@pytest.fixture(scope="session")
def vllm_model(vllm_venv: Path) -> Path:
    value = os.environ.get(MODEL_ENV)
    if not value or not (Path(value) / "config.json").exists():
        pytest.fail(f"${MODEL_ENV}={value!r} is no model directory: run `make test-engine`")
    return Path(value).resolve()


@pytest.fixture(scope="module")
def vllm_server(
    vllm_venv: Path, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartVllm]:
    """Factory: ``vllm_server(max_num_seqs=4, ...)`` starts a vLLM server and waits for
    ``/health`` 200; every server it started is stopped at the end of the module (25-35 s
    and ~2.6 GB each: a module's tests share theirs)."""
    started: list[VllmServer] = []
    workdir = tmp_path_factory.mktemp("vllm")

    def start(*, wait: bool = True, **options: object) -> VllmServer:
        server = VllmServer(
            workdir / f"vllm-{len(started)}",
            vllm_venv,
            vllm_model,
            vllm_venv.parent / "state",
            **options,  # type: ignore[arg-type]
        )
        started.append(server)
        return server.start() if wait else server.spawn()

    try:
        yield start
    finally:
        for server in started:
            server.stop()


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
