"""llm-health: TTFT micro-probe health checking for Envoy-based LLM gateways.

``__version__`` is the installed distribution's version (its metadata, written from
pyproject.toml when the wheel or the editable install is built), so ``llm-health
--version``, ``llm_health_build_info`` and the image tag all say the same number. A source
tree that is only on ``sys.path`` (never installed) reads it from its own pyproject.toml.
It is read when first asked for: importlib.metadata and tomllib are a third of the start-up
of a command that never shows it (``llm-health --help``, ``probe``).
"""

from __future__ import annotations

from pathlib import Path

DISTRIBUTION = "llm-health"
UNKNOWN_VERSION = "0+unknown"


def _source_tree_version() -> str:
    """The version in the pyproject.toml beside ``plugin/`` when this is llm-health's
    source tree, else UNKNOWN_VERSION (read only when no metadata is installed)."""
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return UNKNOWN_VERSION
    if project.get("name") != DISTRIBUTION or not isinstance(project.get("version"), str):
        return UNKNOWN_VERSION
    return str(project["version"])


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return _source_tree_version()


__version__: str  # read on first use, by __getattr__
__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    version = globals()["__version__"] = _version()
    return version
