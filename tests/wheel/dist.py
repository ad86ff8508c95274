"""Building the distribution as a user gets it, for the tests of this directory: the files
git tracks (a fresh clone's) through ``python -m build``, an sdist and a wheel built from
that sdist; and the commands they run, in an environment without the test run's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "dev.lock"


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH (``make`` and the tests put plugin/ on it) and
    without the venv of the test run; pip's own settings (index, certificates) stay."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(command: list[str | Path], cwd: Path, timeout: float = 600) -> str:
    done = subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


def tracked_copy(destination: Path) -> Path:
    """The files git tracks (what a fresh clone has), copied to ``destination``."""
    listed = run(["git", "ls-files", "-z"], ROOT).split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def build(base: Path) -> Built:
    source = tracked_copy(base / "source")
    dist = base / "dist"
    run([sys.executable, "-m", "build", "--outdir", dist, source], base)
    (wheel,) = dist.glob("llm_health-*.whl")
    (sdist,) = dist.glob("llm_health-*.tar.gz")
    shutil.rmtree(source)
    return Built(wheel, sdist)


def locked_constraints(path: Path) -> Path:
    """requirements/dev.lock as a pip constraints file: its pins (markers kept) without the
    hashes, which pip checks only on requirements, and the wheel under test has none."""
    pins = [
        line.rstrip(" \\")
        for line in LOCK.read_text().splitlines()
        if line[:1].isalnum() and "==" in line
    ]
    path.write_text("\n".join(pins) + "\n")
    return path
