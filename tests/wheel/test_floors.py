"""pyproject.toml's floors are versions the code really runs on (docs/design.md §6.5): the
wheel, installed into a fresh venv with every direct dependency at the lowest version its
floor allows (uv's ``--resolution lowest-direct``; what they need in turn at its newest),
serves a probe result of a simulator it runs itself, and its agent answers /readyz 200.
Needs PyPI: run by ``make test-image``."""

from __future__ import annotations

import email.parser
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import http_json
from tests.wheel.dist import ROOT, Built, clean_env, run

UV = Path(sys.executable).with_name("uv")  # from requirements/dev.lock
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


@dataclass(frozen=True)
class Lowest:
    venv: Path
    workdir: Path

    @property
    def script(self) -> Path:
        return self.venv / "bin" / "llm-health"


def floors() -> dict[str, Version]:
    """Each runtime dependency of pyproject.toml -> its floor (``>=``)."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    found: dict[str, Version] = {}
    for line in deps:
        req = Requirement(line)
        lows = [Version(s.version) for s in req.specifier if s.operator == ">="]
        assert lows, f"{line!r}: every runtime dependency states its floor"
        found[canonicalize_name(req.name)] = max(lows)
    return found


@pytest.fixture(scope="module")
def lowest(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Lowest:
    base = tmp_path_factory.mktemp("lowest")
    venv = base / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], base)
    python = venv / "bin" / "python"
    wanted = base / "requires.txt"  # direct to uv, so lowest-direct takes each at its floor
    wanted.write_text("\n".join(requires_dist(built.wheel)) + "\n")
    lowest_direct = ["--resolution", "lowest-direct", "-r", wanted]
    run([UV, "pip", "install", "--quiet", "-p", python, *lowest_direct, built.wheel], base)
    workdir = base / "work"
    workdir.mkdir()
    return Lowest(venv, workdir)


def requires_dist(wheel: Path) -> list[str]:
    """The wheel's own dependency list (its METADATA), extras' aside."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    requires = metadata.get_all("Requires-Dist") or []
    return [r for r in requires if "extra ==" not in r]


def installed_versions(lowest: Lowest) -> dict[str, Version]:
    listed = run([UV, "pip", "freeze", "-p", lowest.venv / "bin" / "python"], lowest.workdir)
    pins = (line.split("==") for line in listed.splitlines() if "==" in line)
    return {canonicalize_name(name): Version(version) for name, version in pins}


def test_every_direct_dependency_is_at_its_floor(lowest: Lowest) -> None:
    have = installed_versions(lowest)
    off = {name: str(have.get(name)) for name, low in floors().items() if have.get(name) != low}
    assert not off, f"not installed at the floor pyproject.toml states: {off}"


@contextmanager
def running(lowest: Lowest, name: str, *args: str) -> Iterator[None]:
    log_path = lowest.workdir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [lowest.script, *args],
            cwd=lowest.workdir,
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield
        except BaseException as failed:  # pytest's outcomes too (pytest.fail is one)
            failed.add_note(f"{name}'s log, its end:\n{log_tail(log_path)}")
            raise
        finally:
            process.terminate()
            code = process.wait(10)
    assert code == 0, f"{name}: exit {code} on SIGTERM\n{log_tail(log_path)}"


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a process's log: enough to see why, bounded."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def sim(lowest: Lowest) -> Iterator[int]:
    port = free_port()
    with running(lowest, "sim", "sim", "--host", "127.0.0.1", "--port", str(port)):
        yield port


def probed(status: dict[str, Any]) -> list[dict[str, Any]]:
    endpoints = (e for c in status["clusters"] for e in c["endpoints"])
    return [e for e in endpoints if e.get("last_probe")]


def test_serve_at_the_floors_publishes_a_probe_result(lowest: Lowest, sim: int) -> None:
    http, grpc = free_port(), free_port()
    config = lowest.workdir / "serve.yaml"
    config.write_text(
        f'server: {{grpc: "127.0.0.1:{grpc}", http: "127.0.0.1:{http}"}}\n'
        "clusters:\n"
        f"  - {{name: c, model: sim-model, endpoints: [{{address: 127.0.0.1:{sim}}}]}}\n",
        encoding="utf-8",
    )
    with running(lowest, "serve", "serve", "--config", config.name):
        url = f"http://127.0.0.1:{http}/status"
        done = wait_until(lambda: probed(http_json(url)), 60, "a probe result", ignore=(OSError,))
    assert done[0]["last_probe"]["outcome"] == "fast", done


def test_agent_at_the_floors_answers_ready(lowest: Lowest, sim: int) -> None:
    http = free_port()
    with running(
        lowest,
        "agent",
        "agent",
        "--engine",
        f"http://127.0.0.1:{sim}",
        "--http",
        f"127.0.0.1:{http}",
    ):
        url = f"http://127.0.0.1:{http}/readyz"
        wait_until(lambda: ready(url), 60, "/readyz 200", ignore=(OSError,))


def ready(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return False
