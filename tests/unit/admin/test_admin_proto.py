"""The committed admin API code (plugin/llm_health/adminpb) is what `make proto` makes
from proto/llm_health/v1/admin.proto today: regenerate into a temp dir and compare."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "plugin" / "llm_health" / "adminpb"
FILES = ("__init__.py", "admin_pb2.py", "admin_pb2.pyi", "admin_pb2_grpc.py")


def regenerate(out: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    regenerate(tmp_path)
    stale = [
        name for name in FILES if (tmp_path / name).read_bytes() != (COMMITTED / name).read_bytes()
    ]
    assert not stale, f"stale generated files {stale}: run `make proto` and commit the result"


def test_staleness_is_detected(tmp_path: Path) -> None:
    """The check above can fail: a changed proto yields different code."""
    proto = (ROOT / "proto" / "llm_health" / "v1" / "admin.proto").read_text()
    fake_root = tmp_path / "repo"
    (fake_root / "proto" / "llm_health" / "v1").mkdir(parents=True)
    (fake_root / "proto" / "generate.py").write_text((ROOT / "proto" / "generate.py").read_text())
    changed = proto.replace("bool removing = 16;", "bool removing = 16;\n  string extra = 99;")
    assert changed != proto
    (fake_root / "proto" / "llm_health" / "v1" / "admin.proto").write_text(changed)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(fake_root / "proto" / "generate.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "admin_pb2.py").read_bytes() != (COMMITTED / "admin_pb2.py").read_bytes()


def test_generated_package_imports_under_llm_health() -> None:
    from llm_health.adminpb import admin_pb2, admin_pb2_grpc

    assert admin_pb2.Endpoint.DESCRIPTOR.full_name == "llm_health.v1.Endpoint"
    assert admin_pb2.Endpoint.__module__ == "llm_health.adminpb.admin_pb2"
    assert hasattr(admin_pb2_grpc, "AdminStub")
    text = (COMMITTED / "admin_pb2_grpc.py").read_text()
    assert "from llm_health.adminpb import admin_pb2" in text
    assert "from llm_health.v1" not in text


def _floor(requirement: str) -> Version:
    """The lowest version pyproject.toml's dependency ``requirement`` (a name) allows."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    for line in deps:
        req = Requirement(line)
        if req.name == requirement:
            floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
            assert floors, f"{line!r} has no floor"
            return max(floors)
    raise AssertionError(f"{requirement} is not a runtime dependency")


def _generated_versions() -> tuple[Version, Version]:
    """(grpcio, protobuf) the committed code refuses to run below (its own checks)."""
    grpc_text = (COMMITTED / "admin_pb2_grpc.py").read_text()
    pb_text = (COMMITTED / "admin_pb2.py").read_text()
    grpc_at = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", grpc_text)
    pb_at = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*[\w.]+,\s*(\d+),\s*(\d+),\s*(\d+),", pb_text
    )
    assert grpc_at and pb_at, "the generated code's version checks moved: update this test"
    return Version(grpc_at.group(1)), Version(".".join(pb_at.groups()))


def test_generated_code_runs_at_the_declared_floors() -> None:
    """A wheel installed beside pyproject.toml's lowest grpcio and protobuf imports: the
    generated code's runtime checks never ask for more than the floors promise."""
    grpc_needs, protobuf_needs = _generated_versions()
    assert grpc_needs <= _floor("grpcio"), "raise grpcio's floor or pin an older grpcio-tools"
    assert protobuf_needs <= _floor("protobuf"), "raise protobuf's floor or pin an older tools"
