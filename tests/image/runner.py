"""The built image, run through the tool that built it (``deploy/build-image.sh --tool``).

docker and podman run it as usual (``run --rm --network host``: the image's ENTRYPOINT,
CMD and USER apply). buildah has no ``run`` of an image: a working container is made once
(``buildah from``) and each command runs in it with ``buildah run --isolation chroot``,
which shares the host's network (loopback servers inside are reachable from here). The
image's ENTRYPOINT and USER are read from its config and applied by this class, so what
runs is what Kubernetes would run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.polling import wait_until


@dataclass(frozen=True)
class ImageConfig:
    user: str
    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str]


@dataclass
class Started:
    """A command started in the image; its output goes to ``log_path``."""

    process: subprocess.Popen[bytes]
    name: str
    log_path: Path
    log: IO[bytes] = field(repr=False)

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")


class Image:
    def __init__(self, tool: str, ref: str) -> None:
        self.tool = tool
        self.ref = ref
        self.config = self._read_config()
        self._container: str | None = None

    # ------------------------------------------------------------------ what it is

    def _read_config(self) -> ImageConfig:
        if self.tool == "buildah":
            raw = _json(["buildah", "inspect", "--type", "image", self.ref])
            config = raw["OCIv1"]["config"]
        else:
            config = _json([self.tool, "image", "inspect", self.ref])[0]["Config"]
        env = dict(item.split("=", 1) for item in config.get("Env") or [])
        return ImageConfig(
            user=str(config.get("User") or ""),
            entrypoint=list(config.get("Entrypoint") or []),
            cmd=list(config.get("Cmd") or []),
            env=env,
        )

    def size(self) -> str:
        """As the tool prints it, e.g. ``278 MB``."""
        if self.tool == "buildah":
            return str(_json(["buildah", "images", "--json", self.ref])[0]["size"])
        size = int(_check([self.tool, "image", "inspect", "--format", "{{.Size}}", self.ref]))
        return f"{size / 1e6:.0f} MB"

    def files(self) -> set[str]:
        """Every path in the image's file system (``/usr/bin/python3``, ...)."""
        if self.tool == "buildah":
            root = Path(_check(["buildah", "mount", self._working_container()]))
            try:
                return _walk(root)
            finally:
                subprocess.run(["buildah", "umount", self._working_container()], check=False)
        created = _check([self.tool, "create", self.ref])
        try:
            export = subprocess.run(
                f"{self.tool} export {created} | tar -t",
                shell=True,
                capture_output=True,
                check=True,
            )
        finally:
            subprocess.run([self.tool, "rm", created], capture_output=True, check=False)
        return {"/" + name.rstrip("/") for name in export.stdout.decode().splitlines() if name}

    # ------------------------------------------------------------------ running it

    def command(
        self,
        args: list[str],
        *,
        mounts: dict[Path, str] | None = None,
        env: dict[str, str] | None = None,
        entrypoint: list[str] | None = None,
        name: str | None = None,
    ) -> list[str]:
        """The host command that runs ``args`` after the image's ENTRYPOINT (or
        ``entrypoint``) as the image's USER, with ``mounts`` (host dir -> path, read-only)."""
        mounts = mounts or {}
        env = env or {}
        if self.tool == "buildah":
            argv = [*(self.config.entrypoint if entrypoint is None else entrypoint), *args]
            options = ["--isolation", "chroot", "--user", self.config.user]
            options += [f"--volume={host}:{path}:ro" for host, path in mounts.items()]
            options += [f"--env={key}={value}" for key, value in env.items()]
            return ["buildah", "run", *options, self._working_container(), "--", *argv]
        options = ["--rm", "--network", "host", "--name", name or _name()]
        options += [f"--volume={host}:{path}:ro" for host, path in mounts.items()]
        options += [f"--env={key}={value}" for key, value in env.items()]
        if entrypoint is not None:
            options += ["--entrypoint", entrypoint[0]]
            args = [*entrypoint[1:], *args]
        return [self.tool, "run", *options, self.ref, *args]

    def run(
        self,
        args: list[str],
        *,
        timeout: float = 120,
        mounts: dict[Path, str] | None = None,
        env: dict[str, str] | None = None,
        entrypoint: list[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        command = self.command(args, mounts=mounts, env=env, entrypoint=entrypoint)
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)

    def start(
        self,
        args: list[str],
        log_path: Path,
        *,
        mounts: dict[Path, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> Started:
        name = _name()
        log = log_path.open("ab")
        command = self.command(args, mounts=mounts, env=env, name=name)
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return Started(process, name, log_path, log)

    def terminate(self, started: Started, timeout: float = 10.0) -> int | None:
        """SIGTERM to the program itself (as the kubelet does); its exit code, or None if
        it had to be killed after ``timeout`` seconds."""
        if started.process.poll() is None:
            if self.tool == "buildah":
                os.kill(self._program_pid(started), signal.SIGTERM)
            else:
                subprocess.run([self.tool, "kill", "--signal", "TERM", started.name], check=False)
        try:
            return started.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(started)
            return None
        finally:
            started.log.close()

    def kill(self, started: Started) -> None:
        if started.process.poll() is None:
            if self.tool == "buildah":
                for pid in _descendants(started.process.pid):
                    _signal(pid, signal.SIGKILL)
            else:
                subprocess.run([self.tool, "kill", started.name], capture_output=True, check=False)
            started.process.kill()
            started.process.wait()
        started.log.close()

    def close(self) -> None:
        if self._container is not None:
            subprocess.run(["buildah", "rm", self._container], capture_output=True, check=False)
            self._container = None

    # ------------------------------------------------------------------ buildah

    def _working_container(self) -> str:
        if self._container is None:
            self._container = _check(
                ["buildah", "from", "--pull=never", "--name", _name(), self.ref]
            )
        return self._container

    def _program_pid(self, started: Started) -> int:
        """The program under ``buildah run`` (chroot isolation shares the PID namespace):
        the descendant that is not buildah's own chroot runtime."""

        def program() -> int | None:
            for pid in _descendants(started.process.pid):
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if not comm.startswith(("buildah", "memfd:buildah")):
                    return pid
            return None

        pid = wait_until(program, 10, f"the program under buildah run {started.name}")
        assert pid is not None  # wait_until returns a truthy value
        return pid


def _name() -> str:
    return f"llm-health-image-test-{uuid.uuid4().hex[:8]}"


def _check(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def _json(command: list[str]) -> Any:
    return json.loads(_check(command))


def _walk(root: Path) -> set[str]:
    found = set()
    for directory, dirs, names in os.walk(root):
        relative = "/" + os.path.relpath(directory, root).removeprefix(".").lstrip("/")
        for name in [*dirs, *names]:
            found.add(os.path.join(relative, name))
    return found


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, nearest first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
