"""``llm_health.__version__`` and ``llm-health --version`` come from the installed
distribution's metadata; a source tree that is not installed reads its pyproject.toml."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest

import llm_health
from llm_health.cli import build_parser

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def pyproject_version() -> str:
    return str(tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["version"])


@pytest.fixture
def afresh(monkeypatch: pytest.MonkeyPatch) -> Callable[[], str]:
    """Reads ``llm_health.__version__`` anew: it is read once, then kept. The kept value,
    read before the test patches anything, is put back after it."""
    monkeypatch.setitem(vars(llm_health), "__version__", llm_health.__version__)

    def read() -> str:
        del vars(llm_health)["__version__"]
        return llm_health.__version__

    return read


def not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def version(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)


def test_the_version_is_the_installed_metadata() -> None:
    assert llm_health.__version__ == metadata.version("llm-health")


def test_the_cli_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"llm-health {llm_health.__version__}"


def test_without_metadata_the_source_tree_says_it(
    monkeypatch: pytest.MonkeyPatch, afresh: Callable[[], str]
) -> None:
    not_installed(monkeypatch)
    assert afresh() == pyproject_version()


def test_outside_a_source_tree_it_is_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, afresh: Callable[[], str]
) -> None:
    not_installed(monkeypatch)
    fake = tmp_path / "plugin" / "llm_health" / "__init__.py"
    fake.parent.mkdir(parents=True)
    monkeypatch.setattr(llm_health, "__file__", str(fake))
    assert afresh() == llm_health.UNKNOWN_VERSION
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\nversion = "9"\n')
    assert afresh() == llm_health.UNKNOWN_VERSION
