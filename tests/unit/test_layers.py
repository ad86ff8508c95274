"""Import direction between layers, checked statically with ``ast`` (no module is imported).

    model (pure domain)  <-  probe, xds, hds, authz  <-  servers  <-  app, cli

- ``llm_health.model`` is pure: no grpc/protobuf/envoy/aiohttp/..., and nothing of
  llm_health outside ``model`` and ``errors``.
- ``probe``, ``xds``, ``hds``, ``authz`` never reach up into ``servers``, ``app`` or ``cli``.
- ``servers`` never reaches up into ``app`` or ``cli``.

Every import counts: top level, inside functions, under ``if TYPE_CHECKING``, and
``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "plugin"
PACKAGE = PLUGIN / "llm_health"
GENERATED = ("llm_health.adminpb",)  # protoc output: not hand-written, not layered

MODEL_FORBIDDEN_THIRD_PARTY = (
    "grpc",
    "google.protobuf",
    "envoy",
    "xds",  # the xds-protos top-level package (not llm_health.xds)
    "udpa",
    "aiohttp",
    "httpx",
    "yaml",
    "pydantic",
    "prometheus_client",
)
MODEL_ALLOWED_OWN = ("llm_health.model", "llm_health.errors")
UPPER = ("llm_health.servers", "llm_health.app", "llm_health.cli")
MIDDLE = ("llm_health.probe", "llm_health.xds", "llm_health.hds", "llm_health.authz")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. llm_health.model.machine
    target: str  # what it imports, e.g. llm_health.errors or grpc.aio
    line: int

    def __str__(self) -> str:
        return f"{self.module}:{self.target} (line {self.line})"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PLUGIN).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports_of(source: str, module: str, package: bool) -> Iterator[Import]:
    """Every import target in ``source``; relative imports resolved against ``module``."""
    tree = ast.parse(source)
    here = module if package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts)
                source_module = f"{base}.{node.module}" if node.module else base
            else:
                source_module = node.module or ""
            yield Import(module, source_module, node.lineno)
            for alias in node.names:
                if alias.name != "*":
                    # `from llm_health import app` imports the module llm_health.app.
                    yield Import(module, f"{source_module}.{alias.name}", node.lineno)
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield Import(module, first.value, node.lineno)


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def all_imports() -> list[Import]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if under(name, GENERATED):
            continue
        found.extend(imports_of(path.read_text(encoding="utf-8"), name, is_package(path)))
    return found


def violations(imports: list[Import]) -> list[Import]:
    bad = []
    for imp in imports:
        if under(imp.module, ("llm_health.model",)):
            # The bare package is imported by any submodule import: only what follows counts.
            own = under(imp.target, ("llm_health",)) and imp.target != "llm_health"
            if under(imp.target, MODEL_FORBIDDEN_THIRD_PARTY) or (
                own and not under(imp.target, MODEL_ALLOWED_OWN)
            ):
                bad.append(imp)
        elif under(imp.module, MIDDLE):
            if under(imp.target, UPPER):
                bad.append(imp)
        elif under(imp.module, ("llm_health.servers",)) and under(
            imp.target, ("llm_health.app", "llm_health.cli")
        ):
            bad.append(imp)
    return bad


def report(bad: list[Import]) -> str:
    return "layer violations (importing module:imported name):\n  " + "\n  ".join(
        str(b) for b in bad
    )


# --- the real check -----------------------------------------------------------------------


def test_packages_exist() -> None:
    """Guard against a vacuous pass (e.g. the plugin moved and nothing was scanned)."""
    assert (PACKAGE / "model" / "machine.py").is_file()
    assert (PACKAGE / "probe").is_dir()
    names = {i.module for i in all_imports()}
    assert "llm_health.model.machine" in names
    assert "llm_health.probe.scheduler" in names


def test_import_layers() -> None:
    bad = violations(all_imports())
    assert not bad, report(bad)


# --- the checker itself can fail ----------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "package", "source", "target"),
    [
        ("llm_health.model.x", False, "import grpc\n", "grpc"),
        ("llm_health.model.x", False, "from google.protobuf import any_pb2\n", "google.protobuf"),
        ("llm_health.model.x", False, "import aiohttp.web\n", "aiohttp.web"),
        ("llm_health.model.x", False, "from envoy.config.core.v3 import base_pb2\n", "envoy"),
        ("llm_health.model.x", False, "from llm_health.config import Config\n", "config"),
        ("llm_health.model.x", False, "from ..probe import sse\n", "llm_health.probe"),
        ("llm_health.model.x", False, "from .. import hub\n", "llm_health.hub"),
        ("llm_health.model", True, "from ..app import status\n", "llm_health.app"),
        (
            "llm_health.model.x",
            False,
            "def f():\n    import importlib\n    importlib.import_module('llm_health.cli')\n",
            "llm_health.cli",
        ),
        (
            "llm_health.model.x",
            False,
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import grpc\n",
            "grpc",
        ),
        ("llm_health.probe.client", False, "from llm_health.servers import xds\n", "servers"),
        ("llm_health.probe.client", False, "from llm_health import app\n", "llm_health.app"),
        ("llm_health.xds.stream", False, "from ..cli import main\n", "llm_health.cli"),
        ("llm_health.hds.service", False, "import llm_health.app.runtime\n", "app.runtime"),
        ("llm_health.authz", True, "from llm_health.servers.grpc import x\n", "servers"),
        ("llm_health.servers.xds", False, "from llm_health.app import runtime\n", "app"),
        ("llm_health.servers.xds", False, "from ..cli import build_parser\n", "llm_health.cli"),
    ],
)
def test_checker_catches(module: str, package: bool, source: str, target: str) -> None:
    bad = violations(list(imports_of(source, module, package)))
    assert bad, f"{source!r} in {module} not flagged"
    assert any(target in b.target for b in bad)
    assert module in report(bad)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("llm_health.model.x", "from llm_health.errors import DurationError\n"),
        ("llm_health.model.x", "from llm_health import errors\n"),
        ("llm_health.model.x", "from .. import errors\n"),
        ("llm_health.model.x", "from .states import State\nimport hashlib, enum\n"),
        ("llm_health.model.x", "from llm_health.model.outcome import Outcome\n"),
        ("llm_health.probe.client", "import aiohttp\nfrom llm_health.model import Policy\n"),
        ("llm_health.xds.resources", "from envoy.config.core.v3 import base_pb2\n"),
        ("llm_health.servers.xds", "from llm_health.xds.stream import Stream\n"),
        ("llm_health.app.runtime", "from llm_health.servers.xds import serve\n"),
        ("llm_health.cli", "from llm_health.app.validate import register\n"),
    ],
)
def test_checker_allows(module: str, source: str) -> None:
    assert not violations(list(imports_of(source, module, False)))
