"""Import direction between layers, checked statically with ``ast`` (no module is imported).

    rank 0  llm_health (version), errors, model        the pure domain
    rank 1  core                                        the seams: hub, BoardControl,
                                                        Component and its extension points,
                                                        settings building blocks
    rank 2  probe | xds | sim | adminpb                 foundations, never each other
    rank 3  engines | fleet | traffic | hds | authz |   features: pure modules and their
            discovery | remediation | alerts | admin |  settings, never each other
            agent
    rank 4  config | bootstrap                          the file's words -> features' sections
    rank 5  servers | ops                               thin gRPC adapters; the operator
                                                        surface (HTTP, status, page, metrics)
    rank 6  <feature>.component                         each feature's component
    rank 7  app                                         wiring and lifecycle
    rank 8  cli | demo                                  entry points

Rules (``violations``):
- every module of the package belongs to exactly one unit above (a new top-level module
  must be placed in a layer before it can land);
- imports point down: never to a higher rank;
- never sideways between two units of the same rank (foundations, features,
  config/bootstrap, servers/ops, components, cli/demo);
- a feature's component (``llm_health.<feature>.component``) imports ``core`` (and the pure
  domain below it), ``probe``, its own feature package and the shared gRPC/ops helpers
  (``servers``, ``ops``), nothing else: never config, another feature or the app;
- ``model`` is pure: no grpc/protobuf/envoy/aiohttp/..., nothing of llm_health outside
  ``model`` and ``errors``; ``probe`` depends on ``model`` (and ``errors``) only;
- no import cycle between modules (``cycles``).

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
ROOT = "llm_health"
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
PROBE_ALLOWED_OWN = ("llm_health.probe", "llm_health.model", "llm_health.errors")
FEATURES = (
    "llm_health.engines",
    "llm_health.fleet",
    "llm_health.traffic",
    "llm_health.hds",
    "llm_health.authz",
    "llm_health.discovery",
    "llm_health.remediation",
    "llm_health.alerts",
    "llm_health.admin",
    "llm_health.agent",
)
COMPONENT_RANK = 6
LAYERS: tuple[tuple[str, ...], ...] = (
    ("llm_health.errors", "llm_health.model"),
    ("llm_health.core",),
    ("llm_health.probe", "llm_health.xds", "llm_health.sim", "llm_health.adminpb"),
    FEATURES,
    ("llm_health.config", "llm_health.bootstrap"),
    ("llm_health.servers", "llm_health.ops"),
    tuple(f"{feature}.component" for feature in FEATURES),
    ("llm_health.app",),
    ("llm_health.cli", "llm_health.demo"),
)
SIDEWAYS_FORBIDDEN_RANKS = (2, 3, 4, 5, 6, 8)  # rank 0: model's own rule; 1 and 7: one unit
# What a feature's component may import besides its own feature package.
COMPONENT_ALLOWED_OWN = (
    "llm_health.errors",
    "llm_health.model",
    "llm_health.core",
    "llm_health.probe",
    "llm_health.servers",
    "llm_health.ops",
)


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


def sources() -> dict[str, tuple[str, bool]]:
    """Every hand-written module: name -> (source, is a package)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if not under(name, GENERATED):
            found[name] = (path.read_text(encoding="utf-8"), is_package(path))
    return found


def all_imports(modules: dict[str, tuple[str, bool]] | None = None) -> list[Import]:
    found = []
    for name, (source, package) in (sources() if modules is None else modules).items():
        found.extend(imports_of(source, name, package))
    return found


def unit_of(name: str) -> tuple[int, str] | None:
    """(rank, unit) of a module of ours; None for third-party names and the bare root.
    The longest matching unit wins, so ``llm_health.fleet.component`` is a component
    (rank 6), while ``llm_health.fleet.wire`` is the fleet feature (rank 3)."""
    best: tuple[int, str] | None = None
    for rank, units in enumerate(LAYERS):
        for unit in units:
            if under(name, (unit,)) and (best is None or len(unit) > len(best[1])):
                best = rank, unit
    return best


def _own(name: str) -> bool:
    """A module of ours, beyond the bare root package (which only holds the version)."""
    return under(name, (ROOT,)) and name != ROOT and not name.startswith(f"{ROOT}.__")


def violations(imports: list[Import], modules: set[str] | None = None) -> list[Import]:
    """Layer, sideways and purity violations; a module in no layer is reported as
    importing itself ("<module>:<module>")."""
    bad = [Import(m, m, 0) for m in sorted(modules or ()) if _own(m) and unit_of(m) is None]
    for imp in imports:
        if _broken(imp):
            bad.append(imp)
    return bad


def _broken(imp: Import) -> bool:
    if under(imp.module, ("llm_health.model",)) and (
        under(imp.target, MODEL_FORBIDDEN_THIRD_PARTY)
        or (_own(imp.target) and not under(imp.target, MODEL_ALLOWED_OWN))
    ):
        return True
    if under(imp.module, ("llm_health.probe",)) and _own(imp.target):
        return not under(imp.target, PROBE_ALLOWED_OWN)
    source, target = unit_of(imp.module), unit_of(imp.target)
    if source is None or target is None or not _own(imp.target):
        return False
    if source[0] == COMPONENT_RANK:
        own_feature = source[1].removesuffix(".component")
        return not under(imp.target, (*COMPONENT_ALLOWED_OWN, own_feature))
    if target[0] > source[0]:
        return True  # upward
    return target[0] == source[0] in SIDEWAYS_FORBIDDEN_RANKS and target[1] != source[1]


def cycles(imports: list[Import], modules: set[str]) -> list[list[str]]:
    """Import cycles between modules (strongly connected components of two or more, or a
    module importing itself). A name resolves to the longest module it starts with;
    importing one's own parent package does not count (it is already initialising)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        target = _resolve(imp.target, modules)
        if target is None or imp.module.startswith(target + "."):
            continue
        graph[imp.module].add(target)
    return [c for c in _components(graph) if len(c) > 1 or c[0] in graph[c[0]]]


def _resolve(name: str, modules: set[str]) -> str | None:
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on a deep chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return found


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
    assert "llm_health.app.runtime" in names


def test_import_layers() -> None:
    modules = sources()
    bad = violations(all_imports(modules), set(modules))
    assert not bad, report(bad)


def test_no_import_cycles() -> None:
    modules = sources()
    found = cycles(all_imports(modules), set(modules))
    assert not found, f"import cycles: {found}"


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
        ("llm_health.model.x", False, "from ..core import hub\n", "llm_health.core"),
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
        ("llm_health.probe.target", False, "from llm_health.config import X\n", "config"),
        ("llm_health.probe.target", False, "from llm_health.core.hub import X\n", "core"),
        ("llm_health.xds.stream", False, "from ..cli import main\n", "llm_health.cli"),
        ("llm_health.hds.service", False, "import llm_health.app.runtime\n", "app.runtime"),
        ("llm_health.authz", True, "from llm_health.servers.grpc import x\n", "servers"),
        ("llm_health.servers.xds", False, "from llm_health.app import runtime\n", "app"),
        ("llm_health.servers.xds", False, "from ..cli import build_parser\n", "llm_health.cli"),
        # sideways between features, and from a lower layer up to config
        ("llm_health.hds.service", False, "from llm_health.fleet import store\n", "fleet"),
        (
            "llm_health.engines.verify",
            False,
            "from llm_health.traffic.window import X\n",
            "traffic",
        ),
        ("llm_health.engines.verify", False, "from .component import EngineChecks\n", "component"),
        ("llm_health.ops.http", False, "from llm_health.servers.grpc import X\n", "servers"),
        # a component: core, probe, its own feature, servers and ops only
        ("llm_health.fleet.component", False, "from llm_health.config import Config\n", "config"),
        ("llm_health.fleet.component", False, "from llm_health.app.keeper import K\n", "app"),
        ("llm_health.fleet.component", False, "from llm_health.traffic import window\n", "traffic"),
        (
            "llm_health.fleet.component",
            False,
            "from llm_health.xds.nodes import OpenNodes\n",
            "xds",
        ),
        ("llm_health.fleet.component", False, "from ..hds.component import H\n", "hds"),
        ("llm_health.authz.view", False, "from ..alerts import events\n", "llm_health.alerts"),
        ("llm_health.sim.app", False, "from llm_health.probe.sse import X\n", "probe"),
        ("llm_health.xds.stream", False, "from llm_health.config import Config\n", "config"),
        ("llm_health.core.hub", False, "from llm_health.xds import stream\n", "xds"),
        ("llm_health.config.schema", False, "from llm_health.bootstrap import x\n", "bootstrap"),
        ("llm_health.demo", False, "from llm_health.cli import main\n", "llm_health.cli"),
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
        ("llm_health.xds.stream", "from llm_health.core.control import SnapshotSource\n"),
        ("llm_health.servers.xds", "from llm_health.xds.stream import Stream\n"),
        ("llm_health.config.schema", "from llm_health.hds.settings import HdsSettings\n"),
        ("llm_health.app.runtime", "from llm_health.servers.xds import serve\n"),
        ("llm_health.cli", "from llm_health.app.assemble import build_runtime\n"),
        ("llm_health.cli.probe", "from llm_health.cli.argtypes import duration\n"),
        ("llm_health.hds.service", "from llm_health.xds.nodes import OpenNodes\n"),
        ("llm_health.engines.verify", "from llm_health.probe.target import ProbeTarget\n"),
        ("llm_health.fleet.component", "from llm_health.core.control import BoardControl\n"),
        ("llm_health.fleet.component", "from llm_health.fleet.wire import decode\n"),
        ("llm_health.fleet.component", "from .store import Store\n"),
        ("llm_health.fleet.component", "from llm_health.servers.grpc import x\n"),
        ("llm_health.fleet.component", "from llm_health.ops.metrics import counter\n"),
        ("llm_health.fleet.component", "from llm_health.probe.target import ProbeTarget\n"),
        ("llm_health.app.assemble", "from llm_health.fleet.component import FleetComponent\n"),
    ],
)
def test_checker_allows(module: str, source: str) -> None:
    assert not violations(list(imports_of(source, module, False)))


def test_a_module_outside_every_layer_is_reported() -> None:
    bad = violations([], {"llm_health.model.x", "llm_health.helpers"})
    assert [str(b) for b in bad] == ["llm_health.helpers:llm_health.helpers (line 0)"]


@pytest.mark.parametrize(
    ("modules", "expected"),
    [
        (
            {
                "llm_health.app.a": "from llm_health.app import b\n",
                "llm_health.app.b": "from llm_health.app.c import X\n",
                "llm_health.app.c": "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from llm_health.app.a import Y\n",
            },
            [["llm_health.app.a", "llm_health.app.b", "llm_health.app.c"]],
        ),
        ({"llm_health.app.a": "import llm_health.app.a\n"}, [["llm_health.app.a"]]),
        (
            {
                "llm_health.app": "from llm_health.app.a import X\n",
                "llm_health.app.a": "from llm_health.app import b\n",
                "llm_health.app.b": "x = 1\n",
            },
            [],
        ),
    ],
)
def test_cycle_checker(modules: dict[str, str], expected: list[list[str]]) -> None:
    parsed = {name: (text, name == "llm_health.app") for name, text in modules.items()}
    assert cycles(all_imports(parsed), set(parsed)) == expected
