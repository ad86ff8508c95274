"""deploy/Dockerfile, checked statically (no Docker on this machine): multi-stage, the
final stage runs as a numeric non-root user, installs only prebuilt wheels and no build
tools, and starts the console script with the config path the manifests mount.
The checker is shown to fail on bad Dockerfiles."""

from __future__ import annotations

import pytest

from tests.deploy.manifests import (
    DOCKERFILE,
    console_script,
    dockerfile_cmd,
    dockerfile_problems,
    exposed_ports,
    final_user,
    parse_dockerfile,
)

CONFIG_PATH = "/etc/llm-health/llm-health.yaml"
GOOD = """\
ARG PY=python:3.11-slim
FROM ${PY} AS builder
RUN pip wheel --wheel-dir /wheels .
FROM ${PY}
COPY --from=builder /wheels /tmp/wheels
RUN pip install --no-index --find-links=/tmp/wheels llm-health \\
    && rm -rf /tmp/wheels
USER 10001:10001
ENTRYPOINT ["llm-health"]
CMD ["serve", "--config", "/etc/llm-health/llm-health.yaml"]
"""


def problems(text: str) -> list[str]:
    return dockerfile_problems(text, script="llm-health", config_path=CONFIG_PATH)


def test_the_shipped_dockerfile_has_no_problems() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert problems(text) == []
    stages = parse_dockerfile(text)
    assert [s.name for s in stages] == ["builder", "runtime"]
    assert stages[-1].base == "python:3.11-slim-bookworm"
    # the final stage gets only wheels from the builder, never the source tree
    copies = [c.args for c in stages[-1].all("COPY")]
    assert copies == ["--from=builder /wheels /tmp/wheels"]


def test_the_entrypoint_is_the_packaged_console_script() -> None:
    assert console_script() == "llm-health"
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert dockerfile_problems(text, script=console_script(), config_path=CONFIG_PATH) == []
    assert dockerfile_cmd(text)[:3] == ["serve", "--config", CONFIG_PATH]
    assert final_user(text) == "10001:10001"
    assert exposed_ports(text) == {18000, 18080}


def test_the_builder_builds_the_package_from_pyproject() -> None:
    builder = parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))[0]
    copied = " ".join(c.args for c in builder.all("COPY"))
    assert "pyproject.toml" in copied
    assert "plugin" in copied
    assert any("pip wheel" in r.args for r in builder.all("RUN"))


def test_the_dockerignore_sends_what_the_builder_copies() -> None:
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text(encoding="utf-8")
    lines = [line for line in ignore.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!plugin/"} <= set(lines)


def test_the_good_example_passes() -> None:
    assert problems(GOOD) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.replace("USER 10001:10001\n", ""), "no USER"),
        (lambda t: t.replace("USER 10001:10001", "USER root"), "numeric UID"),
        (lambda t: t.replace("USER 10001:10001", "USER 0"), "root"),
        (
            lambda t: t.replace(
                "USER 10001", "RUN apt-get update && apt-get install -y gcc\nUSER 10001"
            ),
            "build tool gcc",
        ),
        (
            lambda t: t.replace(
                "USER 10001",
                "RUN apt-get install -y --no-install-recommends \\\n  libpq-dev\nUSER 10001",
            ),
            "build tool libpq-dev",
        ),
        (lambda t: t.replace("--no-index ", ""), "from an index"),
        (
            lambda t: t.replace("llm-health \\", "llm-health setuptools \\"),
            "build package setuptools",
        ),
        (lambda t: t.replace('["llm-health"]', "llm-health"), "ENTRYPOINT"),
        (lambda t: t.replace("/etc/llm-health/llm-health.yaml", "/config.yaml"), "config at"),
        (lambda t: t.replace("FROM ${PY}\n", "FROM ubuntu:24.04\n"), "python *-slim"),
        (lambda t: t.split("FROM ${PY}\n")[0].replace("AS builder", ""), "stage"),
    ],
)
def test_the_checker_catches(edit: object, expected: str) -> None:
    bad = edit(GOOD)  # type: ignore[operator]
    found = problems(bad)
    assert any(expected in p for p in found), found
