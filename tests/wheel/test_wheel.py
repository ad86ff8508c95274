"""The distribution as a user gets it: ``python -m build`` on the tracked files of the
repository (a fresh clone's) gives an sdist and a wheel (built from that sdist); the wheel,
installed into a fresh venv and run from an empty directory with none of the repository on
``sys.path``, prints its version, validates the example config and serves the status page
from its package data. Needs PyPI (the build backend, the dependencies): run by
``make test-image`` (docs/kubernetes.md), not by ``make test``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.polling import wait_until
from tests.ports import free_port
from tests.wheel.dist import Built, clean_env, locked_constraints, run

ROOT = Path(__file__).resolve().parents[2]
PAGE_ASSETS = ("index.html", "page.css", "page.js")  # plugin/llm_health/ops/page
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    sdist: Path
    workdir: Path  # empty but for what a test writes: nothing of the repository

    @property
    def script(self) -> Path:
        return self.venv / "bin" / "llm-health"


def version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return str(project["version"])


@pytest.fixture(scope="module")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel in a fresh venv, its dependencies at the versions requirements/dev.lock
    pins (constraints: the same releases every run; docs/design.md §6.5)."""
    base = tmp_path_factory.mktemp("wheel")
    venv = base / "venv"
    run([sys.executable, "-m", "venv", venv], base)
    constraints = locked_constraints(base / "constraints.txt")
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet"]
    run([*pip, "-c", constraints, built.wheel], base)
    workdir = base / "work"
    workdir.mkdir()
    return Installed(venv, built.wheel, built.sdist, workdir)


def test_the_wheel_carries_the_package_data_and_nothing_else(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    for asset in PAGE_ASSETS:
        assert f"llm_health/ops/page/{asset}" in names
    assert "llm_health/py.typed" in names
    tops = {name.split("/")[0] for name in names}
    assert tops == {"llm_health", f"llm_health-{version()}.dist-info"}, tops


def test_the_installed_package_is_imported_from_the_venv(installed: Installed) -> None:
    where = run(
        [
            installed.venv / "bin" / "python",
            "-I",
            "-c",
            "import llm_health; print(llm_health.__file__)",
        ],
        installed.workdir,
    )
    assert Path(where.strip()).is_relative_to(installed.venv), where
    assert not Path(where.strip()).is_relative_to(ROOT), where


def test_version_comes_from_the_installed_metadata(installed: Installed) -> None:
    assert run([installed.script, "--version"], installed.workdir).strip() == (
        f"llm-health {version()}"
    )


def test_the_example_config_validates(installed: Installed) -> None:
    config = installed.workdir / "llm-health.yaml"
    shutil.copy(ROOT / "examples" / "llm-health.yaml", config)
    run([installed.script, "validate", "--config", config.name], installed.workdir)


@pytest.fixture
def serving(installed: Installed) -> Iterator[int]:
    """``serve`` from the installed wheel on loopback (one endpoint nobody listens on); its
    HTTP port."""
    http, grpc, dead = free_port(), free_port(), free_port()
    config = installed.workdir / "serve.yaml"
    config.write_text(
        f'server: {{grpc: "127.0.0.1:{grpc}", http: "127.0.0.1:{http}"}}\n'
        "clusters:\n"
        f"  - {{name: c, model: m, endpoints: [{{address: 127.0.0.1:{dead}}}]}}\n",
        encoding="utf-8",
    )
    log = (installed.workdir / "serve.log").open("wb")
    process = subprocess.Popen(
        [installed.script, "serve", "--config", config.name],
        cwd=installed.workdir,
        env=clean_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield http
    finally:
        process.terminate()
        code = process.wait(10)
        log.close()
        text = (installed.workdir / "serve.log").read_text(errors="replace")
        assert code == 0, f"serve: exit {code} on SIGTERM\n{text[-3000:]}"


def fetch(url: str) -> tuple[int, str]:
    try:
        with _OPENER.open(url, timeout=2) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, ""


def distinctive_line(asset: str) -> str:
    """The longest line of a page asset in the repository, placeholders aside."""
    text = (ROOT / "plugin" / "llm_health" / "ops" / "page" / asset).read_text(encoding="utf-8")
    return max((line.strip() for line in text.splitlines() if "__" not in line), key=len)


def test_the_status_page_is_served_from_the_installed_package(serving: int) -> None:
    """GET / is index.html with page.css and page.js inline (ops/status_page.py): all
    three come from the wheel's package data."""
    url = f"http://127.0.0.1:{serving}/"
    status, page = wait_until(lambda: fetch(url), 30, url, ignore=(OSError,))
    assert status == 200 and "<html" in page.lower(), page[:200]
    for asset in PAGE_ASSETS:
        assert distinctive_line(asset) in page, f"the page lacks {asset}"
