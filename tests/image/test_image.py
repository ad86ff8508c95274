"""The built container image, run: the console script as the image's user (10001), the
package version, the shipped Kubernetes config accepted, ``serve`` (the image's own CMD)
answering /livez, /readyz and the status page from the host and stopping cleanly on
SIGTERM, ``agent`` answering /healthz, and an image without compiler, pip or source tree.
Each step is its own test, so a failure names the step."""

from __future__ import annotations

import re
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from tests.deploy.manifests import ROOT, arg_after, configmap_file, container
from tests.image.runner import Image, Started
from tests.polling import wait_until
from tests.ports import free_port

UID = "10001"
MAX_SIZE_MB = 400  # measured 278 MB on the debootstrapped Debian 12 base (docs/kubernetes.md)
COMPILERS = {"gcc", "cc", "c++", "g++", "clang", "cc1", "ld", "as", "make"}
INSTALLERS = ("pip", "setuptools", "wheel")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return str(project["version"])


def get(url: str) -> tuple[int, str]:
    try:
        with _OPENER.open(url, timeout=2) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def answers(url: str, started: Started, status: int = 200, timeout: float = 30) -> str:
    """Wait until ``url`` answers ``status``; the body. Fails at once (with the log) if the
    program exits."""

    def check() -> str | None:
        if started.process.poll() is not None:
            raise AssertionError(f"exited {started.process.returncode}:\n{started.log_text()}")
        code, body = get(url)
        return body if code == status else None

    try:
        body = wait_until(check, timeout, f"{url} -> {status}", fatal=(AssertionError,))
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- log ---\n{started.log_text()[-3000:]}") from error
    assert body is not None  # wait_until returns a truthy value
    return body


def config_dir(directory: Path, name: str, text: str) -> Path:
    """``directory`` holding the file ``name``, readable by the image's user as a mounted
    ConfigMap is (0755 / 0644; pytest's own directories are 0700)."""
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(text, encoding="utf-8")
    (directory / name).chmod(0o644)
    directory.chmod(0o755)
    return directory


def stop(image: Image, started: Started) -> None:
    code = image.terminate(started, timeout=10)
    assert code == 0, f"SIGTERM: exit {code}, expected 0\n{started.log_text()[-3000:]}"


@pytest.fixture(scope="module")
def sim(image: Image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """``llm-health sim`` from the image itself, on loopback: the backend of serve/agent."""
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    started = image.start(["sim", "--port", str(port)], log)
    try:
        answers(f"http://127.0.0.1:{port}/v1/models", started)
        yield port
    finally:
        image.kill(started)


def test_the_image_runs_the_console_script_as_its_numeric_user(image: Image) -> None:
    assert image.config.entrypoint == ["llm-health"]
    assert image.config.user == f"{UID}:{UID}"
    ran = image.run([], entrypoint=["python", "-c", "import os; print(os.getuid(), os.getgid())"])
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [UID, UID]


def test_version_prints_the_package_version(image: Image) -> None:
    ran = image.run(["--version"])
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"llm-health {version()}"


def test_the_shipped_kubernetes_config_is_accepted(image: Image, tmp_path: Path) -> None:
    """deploy/kubernetes/llm-health-config.yaml's llm-health.yaml, mounted where the
    Deployment mounts it, checked by the image's ``validate``."""
    config_path = PurePosixPath(arg_after(container("llm-health")["args"], "--config"))
    text = configmap_file(str(config_path.parent), config_path.name, "llm-health")
    mounted = config_dir(tmp_path / "config", config_path.name, text)
    ran = image.run(
        ["validate", "--config", str(config_path)], mounts={mounted: str(config_path.parent)}
    )
    assert ran.returncode == 0, f"validate: exit {ran.returncode}\n{ran.stdout}{ran.stderr}"


def test_serve_answers_from_the_host_and_stops_on_sigterm(
    image: Image, sim: int, tmp_path: Path
) -> None:
    """The image's own CMD (serve --config /etc/llm-health/llm-health.yaml), with a loopback
    config mounted there."""
    http, grpc = free_port(), free_port()
    config_path = PurePosixPath(image.config.cmd[image.config.cmd.index("--config") + 1])
    mounted = config_dir(
        tmp_path / "config",
        config_path.name,
        f'server: {{grpc: "127.0.0.1:{grpc}", http: "127.0.0.1:{http}"}}\n'
        "clusters:\n"
        "  - name: sim\n"
        "    model: sim-model\n"
        f"    endpoints: [{{address: 127.0.0.1:{sim}}}]\n",
    )
    started = image.start(
        image.config.cmd, tmp_path / "serve.log", mounts={mounted: str(config_path.parent)}
    )
    try:
        answers(f"http://127.0.0.1:{http}/livez", started)
        assert '"ready": true' in answers(f"http://127.0.0.1:{http}/readyz", started)
        page = answers(f"http://127.0.0.1:{http}/", started)
        assert "<html" in page.lower(), page[:200]  # the status page: package data in the image
    except BaseException:
        image.kill(started)
        raise
    stop(image, started)


def test_agent_answers_healthz(image: Image, sim: int, tmp_path: Path) -> None:
    if image.run(["agent", "--help"]).returncode != 0:
        pytest.skip("this tree has no `llm-health agent` (llm-health agent --help fails)")
    http = free_port()
    started = image.start(
        ["agent", "--engine", f"http://127.0.0.1:{sim}", "--http", f"127.0.0.1:{http}"],
        tmp_path / "agent.log",
    )
    try:
        answers(f"http://127.0.0.1:{http}/healthz", started)
    except BaseException:
        image.kill(started)
        raise
    stop(image, started)


def test_the_image_holds_no_compiler_no_pip_and_no_source_tree(image: Image) -> None:
    files = image.files()
    names = {PurePosixPath(path) for path in files}
    compilers = sorted(
        str(p) for p in names if p.parent.name in ("bin", "sbin") and p.name in COMPILERS
    )
    assert not compilers, f"compilers in the image: {compilers}"
    installers = sorted(
        str(p)
        for p in names
        if p.parent.name in ("site-packages", "dist-packages", "python-wheels", "bin")
        and re.match(rf"({'|'.join(INSTALLERS)})([-_.0-9].*)?$", p.name)
    )
    assert not installers, f"installers in the image: {installers}"
    source = sorted(
        path
        for path in files
        if path in ("/src", "/wheels", "/tmp/wheels")
        or path.endswith(("/pyproject.toml", "/plugin/llm_health", "/.git"))
    )
    assert not source, f"source tree or build leftovers in the image: {source}"
    # what it does hold: the installed package with its status page
    page = [p for p in files if re.search(r"-packages/llm_health/ops/page/index\.html$", p)]
    assert page, "the installed llm_health (with its status page) is not in the image"


def test_the_image_is_small(image: Image) -> None:
    size = image.size()
    parsed = re.fullmatch(r"([0-9.]+)\s*([kMG]B)", size)
    assert parsed, size
    number, unit = parsed.groups()
    megabytes = float(number) * {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[unit]
    assert megabytes <= MAX_SIZE_MB, f"{image.ref} is {size}"
