"""A real inference engine for tests: llama.cpp's ``llama-server`` on loopback.

The binary comes from ``tests/engine/build-llama-server.sh`` (a cache directory outside the
repository, ``$LLM_HEALTH_ENGINE``), the model from ``tests/engine/make_model.py`` (a tiny
random-weight llama). Like every process helper in ``tests/``: loopback only, bounded
waits, and the test that starts a server stops it (context manager, or ``stop()`` in a
finally; the ``llama_server`` fixture of ``tests/engine/conftest.py`` does it for you).

What the server answers is written down in ``docs/engines/llama-cpp.md``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.polling import WaitTimeout, wait_until
from tests.ports import free_port

ENGINE_ENV = "LLM_HEALTH_ENGINE"  # the cache directory build-llama-server.sh prints
SERVER = Path("src/vendor/llama.cpp/build/bin/llama-server")  # inside that directory
DEFAULT_ALIAS = "tiny-llama"

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def server_binary(engine: Path) -> Path:
    return engine / SERVER


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url``: (status, body), for error statuses too; proxies ignored."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def parse_metrics(text: str, prefix: str = "llamacpp:") -> dict[str, float]:
    """Prometheus text format -> {series: value} for the series named ``prefix``...
    (llama-server's series carry no labels, except the per-position speculative one)."""
    values = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


class LlamaServer:
    """``llama-server`` serving ``model`` on 127.0.0.1:``port``, ``/v1/models`` id ``alias``.

    Flags (see docs/engines/llama-cpp.md): ``--metrics`` (no ``/metrics`` without it),
    ``-c``/``-np``: a small context split over a few slots (each slot gets ``ctx / parallel``
    tokens, rounded up to a multiple of 256: ``-c 512 -np 2`` is the smallest exact fit),
    ``-t``/``-tb`` one thread (a test machine has few cores, the model is tiny),
    ``--no-ui``. ``LLAMA_ARG_*`` variables are removed from the environment so the flags
    here are the whole configuration.
    """

    def __init__(
        self,
        workdir: Path,
        engine: Path,
        model: Path,
        *,
        alias: str = DEFAULT_ALIAS,
        ctx: int = 512,
        parallel: int = 2,
        threads: int = 1,
        port: int = 0,
        extra: tuple[str, ...] = (),
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.binary = server_binary(engine)
        self.model = model
        self.alias = alias
        self.port = port or free_port()
        self.log_path = workdir / f"llama-server-{self.port}.log"
        self.args = [
            str(self.binary),
            "-m", str(model),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--alias", alias,
            "--metrics",
            "-c", str(ctx),
            "-np", str(parallel),
            "-t", str(threads),
            "-tb", str(threads),
            "--no-ui",
            *extra,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.started_at: float | None = None
        self.load_s: float | None = None  # spawn -> /health 200

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"

    def start(self, timeout: float = 30.0) -> LlamaServer:
        """Spawn and wait until ``/health`` answers 200 (503 while the model loads)."""
        if not self.binary.exists():
            raise FileNotFoundError(
                f"{self.binary} is missing: run `make test-engine` (builds it) or point "
                f"${ENGINE_ENV} at the directory tests/engine/build-llama-server.sh printed"
            )
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
        self.started_at = time.monotonic()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        try:
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        self.load_s = time.monotonic() - self.started_at
        return self

    def wait_healthy(self, timeout: float = 30.0) -> None:
        def healthy() -> bool:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited:\n{self.log_tail()}")
            return http_get(f"{self.base_url}/health", timeout=1.0)[0] == 200

        try:
            wait_until(healthy, timeout, f"{self.base_url}/health to answer 200", ignore=(OSError,))
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n--- llama-server log tail ---\n{self.log_tail()}") from exc

    def metrics(self, timeout: float = 5.0) -> dict[str, float]:
        """Every ``llamacpp:`` series of ``GET /metrics``."""
        status, body = http_get(f"{self.base_url}/metrics", timeout)
        if status != 200:
            raise RuntimeError(f"GET /metrics: HTTP {status} {body[:200]!r}")
        return parse_metrics(body.decode())

    def pause(self) -> None:
        """SIGSTOP: the process freezes; the kernel still accepts TCP connections."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT: it carries on where it stopped (queued connections included)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 5.0) -> tuple[int | None, float]:
        """SIGTERM (and SIGCONT if paused: a stopped process cannot act on it); SIGKILL
        if it overstays. Returns (exit code, seconds it took); None: it was killed."""
        if self.process is None or self.process.poll() is not None:
            return (self.process.returncode if self.process else None), 0.0
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        if self.paused:
            self.resume()
        try:
            code: int | None = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = None
        return code, time.monotonic() - started

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        with contextlib.suppress(OSError):
            self.stop()


StartServer = Callable[..., LlamaServer]  # the ``llama_server`` fixture (tests/engine/conftest.py)
