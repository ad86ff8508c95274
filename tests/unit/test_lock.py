"""requirements/dev.lock is what `make` installs (docs/design.md §6.5): it must satisfy
pyproject.toml as it stands, so an edited dependency without `make lock` fails here, not
on a fresh clone next month; and the venv the tests run in is the lock, version for
version."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "dev.lock"
RUNTIME_LOCK = ROOT / "requirements" / "runtime.lock"  # the image's (deploy/Dockerfile)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def locked(lock: Path = LOCK) -> dict[str, Version]:
    """Name -> version pinned for this interpreter (markers evaluated here)."""
    pins: dict[str, Version] = {}
    for line in lock.read_text().splitlines():
        match = PIN.match(line)
        if match is None:
            continue
        name, version, marker = match.groups()
        if marker and not Requirement(f"x; {marker}").marker.evaluate():  # type: ignore[union-attr]
            continue
        pins[canonicalize_name(name)] = Version(version)
    return pins


def declared() -> list[Requirement]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    lines = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    tools = (ROOT / "requirements" / "tools.in").read_text().splitlines()
    lines += [t.split("#")[0].strip() for t in tools if t.split("#")[0].strip()]
    return [Requirement(line) for line in lines]


@pytest.mark.parametrize("lock", [LOCK, RUNTIME_LOCK], ids=lambda p: p.name)
def test_every_line_of_the_lock_is_hashed(lock: Path) -> None:
    text = lock.read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text)
    pinned = [b for b in blocks if PIN.match(b.splitlines()[0])]
    assert len(pinned) > 20
    assert all("--hash=sha256:" in b for b in pinned), "regenerate with `make lock`"


def test_the_lock_satisfies_pyproject() -> None:
    pins = locked()
    stale = [
        str(req)
        for req in declared()
        if canonicalize_name(req.name) not in pins
        or not req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True)
    ]
    assert not stale, f"not in the lock or outside it: {stale}; run `make lock`"


def test_the_venv_is_the_lock() -> None:
    """Only where the tests run in make's venv: what pip installed is what the lock says."""
    if not sys.prefix.endswith(".venv"):
        pytest.skip("not make's venv")
    pins = locked()
    drift = {
        name: (str(version), importlib.metadata.version(name))
        for name, version in pins.items()
        if Version(importlib.metadata.version(name)) != version
    }
    assert not drift, f"venv differs from requirements/dev.lock: {drift}; run `make install`"


def test_the_image_gets_the_versions_make_tests() -> None:
    """runtime.lock is the runtime part of dev.lock: every runtime dependency, at the same
    version (`make lock` writes both)."""
    dev, runtime = locked(), locked(RUNTIME_LOCK)
    with (ROOT / "pyproject.toml").open("rb") as f:
        names = [
            canonicalize_name(Requirement(r).name)
            for r in tomllib.load(f)["project"]["dependencies"]
        ]
    assert set(names) <= set(runtime), "run `make lock`"
    differ = {n: (str(v), str(dev.get(n))) for n, v in runtime.items() if dev.get(n) != v}
    assert not differ, f"runtime.lock and dev.lock disagree: {differ}; run `make lock`"
