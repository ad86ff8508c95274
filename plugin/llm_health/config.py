"""The YAML configuration (DESIGN §6): parsed, env-expanded, validated once, frozen.

Errors name the file line and the field path, one line per problem:
    llm-health.yaml:14 clusters[0].probe.timeout: "80x" is not a duration
``load_config`` raises ConfigError carrying every message; nothing else escapes it.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from llm_health.authz.settings import UNROUTED_VALUE, AuthzSettings
from llm_health.errors import ConfigError
from llm_health.hds.settings import CheckSpec, HdsSettings
from llm_health.model.board import ClusterSpec, EndpointSpec
from llm_health.model.durations import parse_duration
from llm_health.model.policy import Policy

MAX_WEIGHT_SUM = 4_294_967_295  # Envoy: per-locality weight sum must fit in uint32
DEFAULT_FATAL_PATTERNS = (
    "CUDA error",
    "CUDA out of memory",
    "illegal memory access",
    "out of memory",
    "NCCL",
    "Xid",
    "EngineDeadError",
    "device-side assert",
    "cuDNN error",
)


def _duration(value: Any, info: ValidationInfo) -> float:
    """A duration string from the file; already-parsed seconds only when merging models."""
    if info.context == _MERGING and isinstance(value, float):
        return value
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f'{value!r} is not a duration: write it as a string, e.g. "800ms"')
    return parse_duration(value)


_MERGING = "merging parsed settings"
Duration = Annotated[float, BeforeValidator(_duration), Field(gt=0)]
_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)


class ProbeSettings(_Frozen):
    """Micro-probe and health policy settings; any key can be overridden per cluster."""

    api: Literal["openai-completions", "openai-chat"] = "openai-completions"
    scheme: Literal["http", "https"] = "http"
    path: str | None = None  # default: /v1/completions or /v1/chat/completions by api
    interval: Duration = 1.0
    timeout: Duration = 0.8
    healthy_ttft: Duration = 0.2
    healthy_after: int = Field(3, ge=1, le=100)
    unhealthy_after: int = Field(2, ge=1, le=100)
    degraded_weight: float = Field(0.3, gt=0, le=1)
    startup_grace: Duration = 600.0
    drain_time: Duration = 30.0
    confirm_delay: Duration = 0.05
    max_loop_lag: Duration = 0.1
    max_ejection_percent: int = Field(50, ge=1, le=100)
    cache_bust: Literal["salt", "prefix", "none"] = "salt"
    prompt: str = Field("hi", min_length=1, max_length=200)
    model: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    fatal_patterns: tuple[str, ...] = DEFAULT_FATAL_PATTERNS

    @model_validator(mode="after")
    def _ttft_within_timeout(self) -> ProbeSettings:
        if self.healthy_ttft >= self.timeout:
            raise ValueError("healthy_ttft must be shorter than timeout")
        return self

    @field_validator("path")
    @classmethod
    def _path_is_absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f'"{value}" must start with "/"')
        return value

    def to_policy(self) -> Policy:
        return Policy(
            healthy_ttft_s=self.healthy_ttft,
            timeout_s=self.timeout,
            healthy_after=self.healthy_after,
            unhealthy_after=self.unhealthy_after,
            degraded_weight=self.degraded_weight,
            startup_grace_s=self.startup_grace,
            drain_time_s=self.drain_time,
            max_loop_lag_s=self.max_loop_lag,
            max_ejection_percent=self.max_ejection_percent,
        )

    def redacted_headers(self) -> dict[str, str]:
        """Header names with values hidden: the only form fit for logs and /status."""
        return {name: "<redacted>" for name in self.headers}


def _optional_probe_model() -> type[BaseModel]:
    """Same fields as ProbeSettings, all optional: a cluster's overrides."""
    fields: dict[str, Any] = {
        name: (_with_metadata(info.annotation, info.metadata) | None, None)
        for name, info in ProbeSettings.model_fields.items()
    }
    return create_model("ProbeOverrides", __base__=_Frozen, **fields)


def _with_metadata(annotation: Any, metadata: list[Any]) -> Any:
    return Annotated[(annotation, *metadata)] if metadata else annotation


if TYPE_CHECKING:
    ProbeOverrides = _Frozen
else:
    ProbeOverrides = _optional_probe_model()


def split_address(address: str) -> tuple[str, int]:
    """ "10.0.0.1:8000" / "[::1]:8000" / "gpu-1.local:8000" -> (host, port); ValueError else."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f'"{address}" is not host:port')
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f'"{address}": port {port} is out of range 1-65535')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)  # ValueError names the problem
        return host, port
    if _is_ipv4_like(host):
        ipaddress.IPv4Address(host)
    elif not _HOSTNAME.match(host):
        raise ValueError(f'"{address}": "{host}" is not a valid host name or IP address')
    return host, port


def _is_ipv4_like(host: str) -> bool:
    return bool(re.fullmatch(r"[\d.]+", host))


class EndpointConfig(_Frozen):
    address: str
    weight: int = Field(100, ge=1, le=1_000_000)

    @field_validator("address")
    @classmethod
    def _valid_address(cls, value: str) -> str:
        host, _port = split_address(value)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            # Envoy rejects (NACKs) a whole EDS update whose socket_address is not an IP
            # literal (config.core.v3.SocketAddress.address; no resolver for EDS hosts).
            raise ValueError(
                f'"{value}": endpoint addresses must be IP literals (Envoy EDS does not '
                "resolve host names); resolve the name first"
            ) from None
        return value

    def to_spec(self) -> EndpointSpec:
        host, port = split_address(self.address)
        return EndpointSpec(self.address, host, port, self.weight)


class ClusterConfig(_Frozen):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:\-]+$")
    model: str | None = None
    probe: ProbeOverrides = Field(default_factory=ProbeOverrides)
    endpoints: tuple[EndpointConfig, ...] = Field(min_length=1)

    @field_validator("endpoints")
    @classmethod
    def _weights_fit(cls, value: tuple[EndpointConfig, ...]) -> tuple[EndpointConfig, ...]:
        if sum(e.weight for e in value) > MAX_WEIGHT_SUM:
            raise ValueError("the sum of endpoint weights exceeds Envoy's uint32 limit")
        return value


class ServerConfig(_Frozen):
    grpc: str = "127.0.0.1:18000"
    http: str = "127.0.0.1:18080"

    @field_validator("grpc", "http")
    @classmethod
    def _valid_bind(cls, value: str) -> str:
        if not value.startswith("unix:"):
            split_address(value)
        return value


def is_local_bind(bind: str) -> bool:
    """True for a Unix socket or a loopback host (127.0.0.0/8, ::1, localhost)."""
    if bind.startswith("unix:"):
        return True
    host, _port = split_address(bind)
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # any other host name may resolve to a routable address


class AdminConfig(_Frozen):
    """The admin gRPC API (llm_health.v1.Admin). ``grpc`` unset: served on server.grpc.
    A non-loopback ``grpc`` needs ``token``; with a token every call must present it."""

    grpc: str | None = None
    token: SecretStr | None = None

    @field_validator("grpc")
    @classmethod
    def _valid_bind(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("unix:"):
            split_address(value)
        return value

    @field_validator("token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (use a random string)")
        return value

    @model_validator(mode="after")
    def _token_off_loopback(self) -> AdminConfig:
        if self.grpc is not None and self.token is None and not is_local_bind(self.grpc):
            raise ValueError(
                f'grpc "{self.grpc}" is not a loopback address: set admin.token '
                '(e.g. token: "${LLM_HEALTH_ADMIN_TOKEN}") or bind 127.0.0.1'
            )
        return self


class XdsConfig(_Frozen):
    coalesce: Duration = 0.02
    warm_start_timeout: Duration = 5.0


class HdsConfig(_Frozen):
    """Health Discovery Service (issue 4); each key is explained on ``HdsSettings`` and
    ``CheckSpec``. Dormant until an Envoy with ``hds_config`` connects."""

    enabled: bool = True
    check: Literal["tcp", "http"] = "tcp"
    path: str = Field("/health", pattern=r"^/[^\s]*$", max_length=2000)
    expected_statuses: tuple[int, ...] = Field((200,), min_length=1, max_length=100)
    body: str | None = Field(None, max_length=65536)
    interval: Duration = 1.0
    timeout: Duration = 1.0
    unhealthy_threshold: int = Field(2, ge=1, le=100)
    healthy_threshold: int = Field(2, ge=1, le=100)
    report_interval: Duration = 1.0
    checkers_per_endpoint: int = Field(2, ge=1, le=100)
    quorum: int | None = Field(None, ge=1, le=100)
    report_ttl: Duration = 5.0

    @field_validator("expected_statuses")
    @classmethod
    def _http_statuses(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [status for status in value if not 100 <= status <= 599]
        if bad:
            raise ValueError(f"{bad[0]} is not an HTTP status (100-599)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> HdsConfig:
        if self.body is not None and self.check != "http":
            raise ValueError("body needs check: http (a tcp check sends nothing)")
        if self.quorum is not None and self.quorum > self.checkers_per_endpoint:
            raise ValueError("quorum cannot exceed checkers_per_endpoint")
        if self.report_ttl <= self.report_interval:
            raise ValueError("report_ttl must be longer than report_interval")
        return self

    def to_settings(self) -> HdsSettings:
        check = CheckSpec(
            kind=self.check,
            path=self.path,
            expected_statuses=self.expected_statuses,
            body=None if self.body is None else self.body.encode(),
            interval_s=self.interval,
            timeout_s=self.timeout,
            unhealthy_threshold=self.unhealthy_threshold,
            healthy_threshold=self.healthy_threshold,
        )
        return HdsSettings(
            enabled=self.enabled,
            check=check,
            report_interval_s=self.report_interval,
            checkers_per_endpoint=self.checkers_per_endpoint,
            quorum=self.quorum,
            report_ttl_s=self.report_ttl,
        )


AlertEventName = Literal["unhealthy", "recovered", "fatal"]


class WebhookConfig(_Frozen):
    """One alert receiver. ``url`` and ``headers`` may hold secrets (a Slack-style URL
    carries its token in the path): only scheme://host:port is ever logged or shown."""

    url: str
    on: tuple[AlertEventName, ...] = Field(("unhealthy", "recovered", "fatal"), min_length=1)
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    timeout: Duration = 5.0

    @model_validator(mode="before")
    @classmethod
    def _yaml_on_key(cls, data: Any) -> Any:
        """YAML 1.1 (PyYAML) reads the bare key ``on`` as the boolean true."""
        if isinstance(data, dict) and True in data and "on" not in data:
            return {("on" if key is True else key): value for key, value in data.items()}
        return data

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value


class AlertsConfig(_Frozen):
    """Webhook alerts; no webhooks (the default): nothing is sent."""

    webhooks: tuple[WebhookConfig, ...] = ()
    dedup_window: Duration = 300.0
    max_per_minute: int = Field(30, ge=1, le=10_000)
    max_attempts: int = Field(5, ge=1, le=20)
    retry_backoff: Duration = 0.5
    max_retry_time: Duration = 120.0
    queue_size: int = Field(1000, ge=1, le=100_000)


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


HeaderName = Annotated[
    str, BeforeValidator(_lower), Field(max_length=100, pattern=r"^[a-z0-9!#$%&'*+.^_`|~-]+$")
]


class AuthzConfig(_Frozen):
    """ext_authz admission (issue 5); each key is explained on ``AuthzSettings``."""

    enabled: bool = True
    cluster_key: str = Field("llm_cluster", min_length=1, max_length=100)
    cluster_header: HeaderName = "x-llm-cluster"
    probe_header: Literal["strip", "deny"] = "strip"
    probe_header_name: HeaderName = "x-llm-probe"
    shed_below: float = Field(0.5, ge=0, le=1)
    priority_header: HeaderName = "x-llm-priority"
    route_header: HeaderName = "x-llm-route"
    route_value: str = Field("healthy", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    capacity_header: HeaderName = "x-llm-capacity"
    retry_after: Duration = 1.0

    @model_validator(mode="after")
    def _distinct(self) -> AuthzConfig:
        names = [self.cluster_header, self.probe_header_name, self.priority_header]
        names += [self.route_header, self.capacity_header]
        if len(set(names)) != len(names):
            raise ValueError("the authz header names must all differ")
        if self.route_value == UNROUTED_VALUE:
            raise ValueError(f'route_value "{UNROUTED_VALUE}" is reserved')
        return self

    def to_settings(self) -> AuthzSettings:
        fields = self.model_dump(exclude={"retry_after"})
        return AuthzSettings(**fields, retry_after_s=max(1, math.ceil(self.retry_after)))


class Config(_Frozen):
    server: ServerConfig = Field(default_factory=ServerConfig)
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    xds: XdsConfig = Field(default_factory=XdsConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    authz: AuthzConfig = Field(default_factory=AuthzConfig)
    hds: HdsConfig = Field(default_factory=HdsConfig)
    clusters: tuple[ClusterConfig, ...] = Field(min_length=1)

    def probe_for(self, cluster: ClusterConfig) -> ProbeSettings:
        """The cluster's effective probe settings: defaults, then its overrides."""
        overrides = cluster.probe.model_dump(exclude_unset=True, exclude_none=True)
        if cluster.model and "model" not in overrides:
            overrides["model"] = cluster.model
        merged = {**self.probe.model_dump(), **overrides}
        return ProbeSettings.model_validate(_unsecret(merged), context=_MERGING)

    def cluster_specs(self) -> tuple[ClusterSpec, ...]:
        return tuple(
            ClusterSpec(
                c.name, self.probe_for(c).to_policy(), tuple(e.to_spec() for e in c.endpoints)
            )
            for c in self.clusters
        )


def _unsecret(data: dict[str, Any]) -> dict[str, Any]:
    headers = data.get("headers") or {}
    plain = {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in headers.items()}
    return {**data, "headers": plain}


# --- loading --------------------------------------------------------------------------

Path_ = tuple[str | int, ...]
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read, expand ``${ENV}`` and validate ``path``. Raises ConfigError with every problem."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{file}: cannot read: {exc}"]) from exc
    return parse_config(text, file.name, os.environ if environ is None else environ)


def parse_config(text: str, source: str, environ: Mapping[str, str]) -> Config:
    raw, lines = _parse_yaml(text, source)
    expanded, env_errors = _expand_env(raw, (), environ)
    env_paths = {p: v for p, v in _env_strings(raw, ())}
    messages = [f"{source}:{_line(lines, p)} {_dotted(p)}: {m}" for p, m in env_errors]
    if messages:
        raise ConfigError(messages)
    config = _validate(expanded, lines, source, env_paths)
    problems = [*_duplicates(config), *_override_problems(config)]
    if problems:
        raise ConfigError([f"{source}:{_line(lines, p)} {_dotted(p)}: {m}" for p, m in problems])
    return config


def _parse_yaml(text: str, source: str) -> tuple[Any, dict[Path_, int]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ConfigError([f"{where} invalid YAML: {getattr(exc, 'problem', exc)}"]) from exc
    if not isinstance(raw, dict):
        raise ConfigError([f"{source}:1 the file must be a YAML mapping with a 'clusters' key"])
    return raw, dict(_node_lines(node, ()))


def _node_lines(
    node: yaml.Node | None, path: Path_, *, own: bool = True
) -> Iterator[tuple[Path_, int]]:
    """(path, 1-based line) for every node. A mapping entry's line is its key's line (not
    its value's, which for a block is the first child's line)."""
    if node is None:
        return
    if own:
        yield path, node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, str(key.value))
            yield child, key.start_mark.line + 1
            yield from _node_lines(value, child, own=False)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _node_lines(item, (*path, index))


def _expand_env(
    value: Any, path: Path_, environ: Mapping[str, str]
) -> tuple[Any, list[tuple[Path_, str]]]:
    """Replace ${VAR} and ${VAR:-default} in every string; report unset variables."""
    if isinstance(value, dict):
        return _expand_items(value.items(), path, environ, dict)
    if isinstance(value, list):
        return _expand_items(enumerate(value), path, environ, list)
    if not isinstance(value, str):
        return value, []
    errors: list[tuple[Path_, str]] = []

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        errors.append((path, f"environment variable {name} is not set"))
        return ""

    return _ENV.sub(substitute, value), errors


def _expand_items(
    items: Any, path: Path_, environ: Mapping[str, str], kind: type
) -> tuple[Any, list[tuple[Path_, str]]]:
    out: list[tuple[Any, Any]] = []
    errors: list[tuple[Path_, str]] = []
    for key, item in items:
        child_path = (*path, key if isinstance(key, int) else str(key))
        expanded, child_errors = _expand_env(item, child_path, environ)
        out.append((key, expanded))
        errors.extend(child_errors)
    return (dict(out) if kind is dict else [v for _, v in out]), errors


def _validate(
    raw: dict[str, Any], lines: dict[Path_, int], source: str, env_paths: dict[Path_, str]
) -> Config:
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, lines, source, env_paths)) from exc


def _override_problems(config: Config) -> Iterator[tuple[Path_, str]]:
    """Cross-field rules on each cluster's merged probe settings (e.g. ttft < timeout)."""
    for index, cluster in enumerate(config.clusters):
        try:
            config.probe_for(cluster)
        except ValidationError as exc:
            for error in exc.errors():
                yield ("clusters", index, "probe", *error["loc"]), _describe(error)


def _duplicates(config: Config) -> Iterator[tuple[Path_, str]]:
    """Duplicate cluster names, and endpoints that are the same host:port however written
    ("[::1]:80" and "[0::1]:80" are one endpoint)."""
    names: set[str] = set()
    for i, cluster in enumerate(config.clusters):
        if cluster.name in names:
            yield ("clusters", i, "name"), f'duplicate cluster name "{cluster.name}"'
        names.add(cluster.name)
        seen: set[tuple[str, int]] = set()
        for j, endpoint in enumerate(cluster.endpoints):
            key = _canonical(endpoint.address)
            if key in seen:
                where: Path_ = ("clusters", i, "endpoints", j, "address")
                yield where, f'duplicate endpoint "{endpoint.address}"'
            seen.add(key)


def _canonical(address: str) -> tuple[str, int]:
    host, port = split_address(address)
    try:
        return str(ipaddress.ip_address(host)), port
    except ValueError:
        return host.lower().rstrip("."), port


def _format_errors(
    exc: ValidationError, lines: dict[Path_, int], source: str, env_paths: dict[Path_, str]
) -> list[str]:
    errors = exc.errors()
    paths: list[Path_] = [tuple(error["loc"]) for error in errors]
    messages = []
    for error, path in zip(errors, paths, strict=True):
        if error["type"] == "too_short" and _has_child_error(path, paths):
            continue  # pydantic's echo of a failed item ("at least 1 item ... not 0")
        text = _describe(error)
        if path in env_paths and isinstance(error.get("input"), str) and error["input"]:
            # The value came from the environment: it may be a secret. Show the reference.
            text = text.replace(error["input"], env_paths[path])
        messages.append(f"{source}:{_line(lines, path)} {_dotted(path)}: {text}")
    return messages


def _env_strings(value: Any, path: Path_) -> Iterator[tuple[Path_, str]]:
    """(path, original text) of every string that references ${ENV}."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _env_strings(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _env_strings(item, (*path, index))
    elif isinstance(value, str) and _ENV.search(value):
        yield path, value


def _has_child_error(path: Path_, paths: list[Path_]) -> bool:
    return any(len(other) > len(path) and other[: len(path)] == path for other in paths)


def _describe(error: Any) -> str:
    """Pydantic's error in the words of this config file."""
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        return _unknown_key(error["loc"])
    if kind == "missing":
        return "required key is missing"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    if kind == "literal_error":
        return f"{error['input']!r} is not one of {error['ctx']['expected']}"
    return f"{error['input']!r}: {message}" if _is_scalar(error.get("input")) else message


def _is_scalar(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


def _unknown_key(loc: tuple[Any, ...]) -> str:
    key = str(loc[-1])
    known = _known_keys(loc[:-1])
    close = difflib.get_close_matches(key, known, n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    return f"unknown key{hint}"


def _known_keys(parent: tuple[Any, ...]) -> list[str]:
    names = [p for p in parent if isinstance(p, str)]
    last = names[-1] if names else ""
    models: dict[str, type[BaseModel]] = {
        "": Config,
        "server": ServerConfig,
        "probe": ProbeSettings,
        "xds": XdsConfig,
        "alerts": AlertsConfig,
        "admin": AdminConfig,
        "authz": AuthzConfig,
        "hds": HdsConfig,
        "webhooks": WebhookConfig,
        "clusters": ClusterConfig,
        "endpoints": EndpointConfig,
    }
    model = models.get(last, Config)
    return list(model.model_fields)


def _line(lines: dict[Path_, int], path: Path_) -> int:
    """Line of the deepest part of ``path`` present in the file (1 when none is)."""
    for depth in range(len(path), -1, -1):
        if path[:depth] in lines:
            return lines[path[:depth]]
    return 1


def _dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"
