"""The configuration schema (docs/design.md §6): pydantic models, frozen once validated.

Each feature keeps its own settings type (``hds.HdsSettings``, ``authz.AuthzSettings``,
``model.Policy``, ``probe.ProbeTarget``); the sections here validate the file's words and
convert to those (``to_settings``, ``to_policy``, ``to_target``), so no feature package
reads the config. Loading (YAML, ``${ENV}``, error lines) is ``config.loader``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    FilePath,
    PlainValidator,
    SecretStr,
    create_model,
    field_validator,
    model_validator,
)

from llm_health.authz.settings import UNROUTED_VALUE, AuthzSettings
from llm_health.core.addresses import (
    is_host_name,
    is_ip_host,
    is_local_bind,
    is_service_name,
    split_address,
    split_nameserver,
)
from llm_health.core.settings import (
    MERGING,
    Duration,
    Frozen,
    Headers,
    Int,
    Number,
    UrlPath,
    regex,
)
from llm_health.discovery.settings import DiscoverySettings, DnsSettings
from llm_health.fleet.settings import FleetConfig
from llm_health.hds.settings import CheckSpec, HdsSettings
from llm_health.model.board import ClusterSpec, EndpointSpec
from llm_health.model.causes import Cause
from llm_health.model.policy import Policy
from llm_health.model.redact import secret_forms
from llm_health.model.states import State
from llm_health.probe.target import (
    DEFAULT_FATAL_PATTERNS,
    MetricsSpec,
    ProbeTarget,
    VerifySpec,
    compile_fatal_patterns,
    endpoint_url,
)
from llm_health.remediation.settings import Limits, Rule
from llm_health.traffic.settings import BusySettings, QualitySettings

MAX_WEIGHT_SUM = 4_294_967_295  # Envoy: per-locality weight sum must fit in uint32
MAX_CLUSTERS = 2_000  # per file (README "Limits")
MAX_ENDPOINTS = 50_000  # per file, over every cluster
MAX_FATAL_PATTERNS = 100
Discovered = Mapping[str, tuple[EndpointSpec, ...]]  # cluster -> endpoints found in DNS


class VerifyConfig(Frozen):
    """``probe.verify``: the known-answer probe (docs/design.md §14). ``expect``: a regex
    the answer must match (searched, not anchored); null: the cluster's consensus."""

    enabled: bool = True
    every: Duration = Field(30.0, ge=1.0, le=86400.0)
    prompt: str = Field("The capital of France is", min_length=1, max_length=500)
    max_tokens: Int = Field(3, ge=1, le=32)
    expect: Annotated[str | None, AfterValidator(regex)] = Field(None, max_length=500)

    def to_spec(self) -> VerifySpec | None:
        if not self.enabled:
            return None
        expect = re.compile(self.expect) if self.expect is not None else None
        return VerifySpec(self.every, self.prompt, self.max_tokens, expect)


class EngineMetricsConfig(Frozen):
    """``probe.engine_metrics``: saturation from the engine's own /metrics (§14.3);
    ``path: null`` disables it."""

    path: UrlPath | None = "/metrics"
    interval: Duration = Field(1.0, ge=0.1, le=3600.0)
    queue_threshold: Number = Field(5.0, gt=0, le=1_000_000)
    kv_cache_threshold: Number = Field(0.8, gt=0, le=1)

    def to_spec(self) -> MetricsSpec | None:
        if self.path is None:
            return None
        return MetricsSpec(self.path, self.interval, self.queue_threshold, self.kv_cache_threshold)


class QualityConfig(Frozen):
    """``probe.quality``: the rolling window of real traffic (docs/design.md §15)."""

    window: Duration = Field(60.0, ge=10.0, le=3600.0)
    min_requests: Int = Field(50, ge=1, le=1_000_000)
    max_error_rate: Number = Field(0.01, ge=0, le=1)
    max_p95_ttft: Duration = Field(0.8, le=600.0)

    def to_settings(self) -> QualitySettings:
        return QualitySettings(
            self.window, self.min_requests, self.max_error_rate, self.max_p95_ttft
        )


def _busy_shorthand(value: object) -> object:
    """``backoff_when_busy: true`` is the section with its defaults; ``false``: off."""
    if value is True:
        return {}
    if value is False:
        return None
    return value


class BusyConfig(Frozen):
    """``probe.backoff_when_busy``: probe at most every ``every`` intervals an endpoint
    whose last interval held ``min_requests`` successful real requests and no error."""

    min_requests: Int = Field(10, ge=1, le=1_000_000)
    every: Int = Field(5, ge=2, le=100)

    def to_settings(self) -> BusySettings:
        return BusySettings(self.min_requests, self.every)


class ProbeSettings(Frozen):
    """Micro-probe and health policy settings; any key can be overridden per cluster."""

    api: Literal["openai-completions", "openai-chat"] = "openai-completions"
    scheme: Literal["http", "https"] = "http"
    path: UrlPath | None = None  # default: /v1/completions or /v1/chat/completions by api
    interval: Duration = 1.0
    timeout: Duration = 0.8
    healthy_ttft: Duration = 0.2
    healthy_after: Int = Field(3, ge=1, le=100)
    unhealthy_after: Int = Field(2, ge=1, le=100)
    degraded_weight: Number = Field(0.3, gt=0, le=1)
    startup_grace: Duration = 600.0
    drain_time: Duration = 30.0
    confirm_delay: Duration = 0.05
    # In-flight silence (docs/design.md §3.2): act at healthy_ttft, or at this multiple of
    # the endpoint's own recent TTFT (median of its last successful probes).
    act_on_silence: bool = True
    silence_degrade: Number | None = Field(None, ge=1.5, le=50)
    max_loop_lag: Duration = 0.1
    max_ejection_percent: Int = Field(50, ge=1, le=100)
    # "auto": by engine (vLLM/SGLang cache_salt, llama.cpp cache_prompt: false, else a
    # nonce prefix); docs/engines.md says what is detected and how.
    cache_bust: Literal["auto", "salt", "prefix", "cache_prompt", "none"] = "auto"
    engine: Literal["auto", "vllm", "sglang", "tgi", "trtllm", "llamacpp", "openai"] = "auto"
    verify: VerifyConfig | None = Field(default_factory=VerifyConfig)
    engine_metrics: EngineMetricsConfig | None = Field(default_factory=EngineMetricsConfig)
    models_path: UrlPath | None = "/v1/models"  # the served-model check; null: none
    quality: QualityConfig | None = Field(default_factory=QualityConfig)
    backoff_when_busy: Annotated[BusyConfig | None, BeforeValidator(_busy_shorthand)] = None
    prompt: str = Field("hi", min_length=1, max_length=200)
    model: str | None = Field(None, max_length=500)
    headers: Headers = Field(default_factory=dict)
    fatal_patterns: tuple[Annotated[str, Field(min_length=1, max_length=200)], ...] = Field(
        DEFAULT_FATAL_PATTERNS, max_length=MAX_FATAL_PATTERNS
    )

    @model_validator(mode="after")
    def _ttft_within_timeout(self) -> ProbeSettings:
        if self.healthy_ttft >= self.timeout:
            raise ValueError("healthy_ttft must be shorter than timeout")
        return self

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

    def to_target(
        self, cluster: str, address: str, secrets: frozenset[str] = frozenset()
    ) -> ProbeTarget:
        """The probe of one endpoint of ``cluster`` with these (effective) settings.
        ``secrets``: every configured secret (``Config.secret_values``); this section's
        own header values are always among them."""
        own = secret_forms(v.get_secret_value() for v in self.headers.values())
        return ProbeTarget(
            cluster=cluster,
            address=address,
            url=endpoint_url(self.scheme, address, self.api, self.path),
            api=self.api,
            model=self.model,
            prompt=self.prompt,
            cache_bust=self.cache_bust,
            timeout_s=self.timeout,
            healthy_ttft_s=self.healthy_ttft,
            interval_s=self.interval,
            confirm_delay_s=self.confirm_delay,
            unhealthy_after=self.unhealthy_after,
            act_on_silence=self.act_on_silence,
            silence_degrade=self.silence_degrade,
            engine=self.engine,
            verify=self.verify.to_spec() if self.verify is not None else None,
            metrics=self.engine_metrics.to_spec() if self.engine_metrics is not None else None,
            models_path=self.models_path,
            fatal_patterns=compile_fatal_patterns(self.fatal_patterns),
            headers={k: v.get_secret_value() for k, v in self.headers.items()},
            secrets=own | secrets,
        )

    def redacted_headers(self) -> dict[str, str]:
        """Header names with values hidden: the only form fit for logs and /status."""
        return {name: "<redacted>" for name in self.headers}


_SECTIONS = frozenset(
    {"verify", "engine_metrics", "quality", "backoff_when_busy"}
)  # merged key by key per cluster
_NULLABLE_PROBE_KEYS = frozenset(
    name
    for name, info in ProbeSettings.model_fields.items()
    if not info.is_required() and type(None) in getattr(info.annotation, "__args__", ())
)


def _optional_probe_model() -> type[BaseModel]:
    """Same fields as ProbeSettings, all optional: a cluster's overrides."""
    fields: dict[str, Any] = {
        name: (_with_metadata(info.annotation, info.metadata) | None, None)
        for name, info in ProbeSettings.model_fields.items()
    }
    return create_model("ProbeOverrides", __base__=Frozen, **fields)


def _with_metadata(annotation: Any, metadata: list[Any]) -> Any:
    return Annotated[(annotation, *metadata)] if metadata else annotation


if TYPE_CHECKING:
    ProbeOverrides = Frozen
else:
    ProbeOverrides = _optional_probe_model()


class EndpointConfig(Frozen):
    address: str = Field(max_length=300)
    weight: Int = Field(100, ge=1, le=1_000_000)

    @field_validator("address")
    @classmethod
    def _valid_address(cls, value: str) -> str:
        host, _port = split_address(value)
        if not is_ip_host(host):
            # Envoy rejects (NACKs) a whole EDS update whose socket_address is not an IP
            # literal (config.core.v3.SocketAddress.address; no resolver for EDS hosts).
            raise ValueError(
                f'"{value}": endpoint addresses must be IP literals (Envoy EDS does not '
                "resolve host names); resolve the name first"
            )
        return value

    def to_spec(self) -> EndpointSpec:
        host, port = split_address(self.address)
        return EndpointSpec(self.address, host, port, self.weight)


class DiscoveryConfig(Frozen):
    """``clusters[].discovery``: endpoints from DNS (docs/design.md §11). Exactly one of
    ``dns`` (A and AAAA records of a name, every address on ``port``) and ``srv`` (SRV
    records: each target's addresses on the record's port)."""

    dns: str | None = Field(None, max_length=253)
    srv: str | None = Field(None, max_length=253)
    port: Int | None = Field(None, ge=1, le=65535)
    refresh: Duration = Field(5.0, ge=0.5, le=3600.0)
    weight: Int = Field(100, ge=1, le=1_000_000)
    max_endpoints: Int = Field(1000, ge=1, le=10_000)

    @field_validator("dns")
    @classmethod
    def _host_name(cls, value: str | None) -> str | None:
        if value is not None and not is_host_name(value):
            raise ValueError(f'"{value}" is not a DNS name (letters, digits, "-", dots)')
        return value

    @field_validator("srv")
    @classmethod
    def _service_name(cls, value: str | None) -> str | None:
        if value is not None and not is_service_name(value):
            raise ValueError(f'"{value}" is not an SRV name (e.g. "_http._tcp.svc.example")')
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DiscoveryConfig:
        if (self.dns is None) == (self.srv is None):
            raise ValueError("set exactly one of dns (with port) and srv")
        if self.dns is not None and self.port is None:
            raise ValueError("dns discovery needs a port: every address is an endpoint on it")
        if self.srv is not None and self.port is not None:
            raise ValueError("srv discovery takes each target's port from its record: drop port")
        return self

    def to_settings(self, cluster: str) -> DiscoverySettings:
        return DiscoverySettings(
            cluster=cluster,
            name=self.dns or self.srv or "",
            kind="dns" if self.dns is not None else "srv",
            port=self.port,
            refresh_s=self.refresh,
            weight=self.weight,
            max_endpoints=self.max_endpoints,
        )


class DnsConfig(Frozen):
    """``dns:``: the servers discovery asks (none: the system's /etc/resolv.conf)."""

    nameservers: tuple[str, ...] = Field((), max_length=10)
    timeout: Duration = Field(2.0, le=30.0)

    @field_validator("nameservers")
    @classmethod
    def _ip_literals(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            split_nameserver(text)  # ValueError names the problem
        return value

    def to_settings(self) -> DnsSettings:
        return DnsSettings(tuple(split_nameserver(t) for t in self.nameservers), self.timeout)


class ClusterConfig(Frozen):
    name: str = Field(min_length=1, max_length=200)
    model: str | None = Field(None, max_length=500)
    probe: ProbeOverrides = Field(default_factory=ProbeOverrides)
    endpoints: tuple[EndpointConfig, ...] = Field((), max_length=MAX_ENDPOINTS)
    discovery: DiscoveryConfig | None = None

    @model_validator(mode="after")
    def _has_endpoints(self) -> ClusterConfig:
        if not self.endpoints and self.discovery is None:
            raise ValueError(f"cluster {self.name}: give endpoints, discovery, or both")
        return self

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        # The name is an EDS resource name and may end up in a file or URL path: never
        # ".", "..", "/x" or "-x" (an option), only a letter or digit first.
        if not _CLUSTER_NAME.fullmatch(value):
            raise ValueError(
                f'"{value}" is not a cluster name: use A-Z a-z 0-9 _ . : - and start with '
                "a letter or a digit"
            )
        return value

    @field_validator("endpoints")
    @classmethod
    def _weights_fit(cls, value: tuple[EndpointConfig, ...]) -> tuple[EndpointConfig, ...]:
        if sum(e.weight for e in value) > MAX_WEIGHT_SUM:
            raise ValueError("the sum of endpoint weights exceeds Envoy's uint32 limit")
        return value


class ServerTlsConfig(Frozen):
    """TLS on the main gRPC port (``server.tls``). ``client_ca`` set: mutual TLS, every
    client (Envoy, admin CLI) must present a certificate signed by that CA."""

    cert: FilePath
    key: FilePath
    client_ca: FilePath | None = None


_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


MAX_PROBE_WORKERS = 64


def _probe_workers(value: object) -> int | str:
    if value == "auto":
        return "auto"
    counts = isinstance(value, int) and not isinstance(value, bool)
    if counts and 0 <= value <= MAX_PROBE_WORKERS:  # type: ignore[operator]
        return value  # type: ignore[return-value]
    raise ValueError(
        f'must be a number of worker processes from 0 to {MAX_PROBE_WORKERS}, or "auto" '
        f"(one per core), got {value!r}"
    )


class ServerConfig(Frozen):
    """``token``: every call on ``grpc`` (xDS, HDS, ext_authz, admin) must carry
    ``authorization: Bearer <token>``, loopback included. A non-loopback, non-Unix ``grpc``
    needs ``token`` or ``tls.client_ca`` (anyone reaching the port could otherwise eject
    endpoints through HDS)."""

    grpc: str = "127.0.0.1:18000"
    http: str = "127.0.0.1:18080"
    # ext_authz on a gRPC server of its own, answered by its own threads (docs/design.md
    # §16.9): admission never waits for the event loop that times the probes. null: on
    # ``grpc`` with everything else. Same token and TLS as ``grpc``. Applies at start.
    authz: str | None = None
    token: SecretStr | None = None
    tls: ServerTlsConfig | None = None
    # Probe worker processes (docs/design.md §16.2): 0 probes on the runtime's own loop;
    # "auto" starts one per core this process may run on. Applies at start.
    probe_workers: Annotated[int | str, PlainValidator(_probe_workers)] = 0

    def probe_worker_count(self) -> int:
        if isinstance(self.probe_workers, int):
            return self.probe_workers
        if hasattr(os, "sched_getaffinity"):
            return len(os.sched_getaffinity(0))
        return os.cpu_count() or 1

    @field_validator("grpc", "http", "authz")
    @classmethod
    def _valid_bind(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("unix:"):
            split_address(value)
        return value

    @field_validator("token")
    @classmethod
    def _token_shape(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        secret = value.get_secret_value()
        if len(secret) < 16:
            raise ValueError("must be at least 16 characters (use a random string)")
        if not secret.isascii() or not secret.isprintable() or " " in secret:
            raise ValueError("must be printable ASCII without spaces (it is sent as a header)")
        return value

    @model_validator(mode="after")
    def _authenticated_off_loopback(self) -> ServerConfig:
        mtls = self.tls is not None and self.tls.client_ca is not None
        if self.authz is not None and self.authz in (self.grpc, self.http):
            raise ValueError(f'authz "{self.authz}" must differ from grpc and http')
        if self.token is None and not mtls and self.authz and not is_local_bind(self.authz):
            raise ValueError(
                f'authz "{self.authz}" is not a loopback address or Unix socket: set '
                "server.token or server.tls.client_ca (mutual TLS); otherwise anyone "
                "reaching the port can read every cluster's admission state"
            )
        if self.token is None and not mtls and not is_local_bind(self.grpc):
            raise ValueError(
                f'grpc "{self.grpc}" is not a loopback address or Unix socket: set '
                'server.token (e.g. token: "${LLM_HEALTH_TOKEN}", sent by Envoy as '
                "initial_metadata) or server.tls.client_ca (mutual TLS); otherwise anyone "
                "reaching the port can eject endpoints through HDS"
            )
        return self


CauseName = Literal[
    "startup_timeout", "slow", "silent", "overloaded", "timeout", "error", "fatal", "signal"
]  # fmt: skip


class WhenConfig(Frozen):
    """``remediation[].when``: the endpoint has been in ``state`` for ``for`` (entered for
    one of ``causes``; empty: any cause)."""

    state: Literal["unhealthy", "degraded"]
    for_: Duration = Field(alias="for", ge=1.0, le=86_400.0)
    causes: tuple[CauseName, ...] = Field((), max_length=20)


class RemediationConfig(Frozen):
    """One remediation hook: ``run`` (an argv, no shell; ``{cluster}`` ``{address}``
    ``{host}`` ``{port}`` ``{state}`` ``{cause}`` are filled in) or ``webhook`` (POSTed a
    JSON body). ``timeout``: a hook still running then is killed (or the POST given up)."""

    when: WhenConfig
    run: tuple[Annotated[str, Field(min_length=1, max_length=4096)], ...] | None = Field(
        None, min_length=1, max_length=64
    )
    webhook: str | None = Field(None, max_length=2000)
    timeout: Duration = Field(30.0, le=3600.0)

    @field_validator("run")
    @classmethod
    def _absolute_program(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value[0].startswith("/"):
            raise ValueError(f'"{value[0]}": the program must be an absolute path (no PATH lookup)')
        return value

    @field_validator("webhook")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("must be an http:// or https:// URL with a host")
        return value

    @model_validator(mode="after")
    def _one_action(self) -> RemediationConfig:
        if (self.run is None) == (self.webhook is None):
            raise ValueError("give exactly one of run (an argv) and webhook")
        return self

    def to_rule(self) -> Rule:
        return Rule(
            state=State(self.when.state),
            for_s=self.when.for_,
            causes=frozenset(Cause(c) for c in self.when.causes),
            run=self.run or (),
            webhook=self.webhook,
            timeout_s=self.timeout,
        )


class LimitsConfig(Frozen):
    """``limits:``: guardrails over every remediation hook."""

    max_concurrent_per_cluster: Int = Field(1, ge=1, le=1000)
    cooldown: Duration = Field(600.0, le=7 * 86_400.0)
    max_per_hour: Int = Field(6, ge=1, le=10_000)
    dry_run: bool = False

    def to_limits(self) -> Limits:
        return Limits(
            self.max_concurrent_per_cluster, self.cooldown, self.max_per_hour, self.dry_run
        )


class AdminConfig(Frozen):
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


class XdsConfig(Frozen):
    coalesce: Duration = 0.02
    warm_start_timeout: Duration = 5.0


class HdsConfig(Frozen):
    """Health Discovery Service (docs/design.md §5.2); each key is explained on ``HdsSettings`` and
    ``CheckSpec``. Dormant until an Envoy with ``hds_config`` connects."""

    enabled: bool = True
    check: Literal["tcp", "http"] = "tcp"
    path: str = Field("/health", pattern=r"^/[^\s]*$", max_length=2000)
    expected_statuses: tuple[Int, ...] = Field((200,), min_length=1, max_length=100)
    body: str | None = Field(None, max_length=65536)
    interval: Duration = 1.0
    timeout: Duration = 1.0
    unhealthy_threshold: Int = Field(2, ge=1, le=100)
    healthy_threshold: Int = Field(2, ge=1, le=100)
    report_interval: Duration = 1.0
    checkers_per_endpoint: Int = Field(2, ge=1, le=100)
    quorum: Int | None = Field(None, ge=1, le=100)
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


AlertEventName = Literal[
    "unhealthy",
    "recovered",
    "fatal",
    "added",
    "removed",
    "discovery_failed",
    "discovery_recovered",
    "fleet_fallback",
    "fleet_recovered",
    "remediation",
]


class WebhookConfig(Frozen):
    """One alert receiver. ``url`` and ``headers`` may hold secrets (a Slack-style URL
    carries its token in the path): only scheme://host:port is ever logged or shown."""

    url: str = Field(max_length=2000)
    on: tuple[AlertEventName, ...] = Field(("unhealthy", "recovered", "fatal"), min_length=1)
    headers: Headers = Field(default_factory=dict)
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


class AlertsConfig(Frozen):
    """Webhook alerts; no webhooks (the default): nothing is sent."""

    webhooks: tuple[WebhookConfig, ...] = Field((), max_length=100)
    dedup_window: Duration = 300.0
    max_per_minute: Int = Field(30, ge=1, le=10_000)
    max_attempts: Int = Field(5, ge=1, le=20)
    retry_backoff: Duration = 0.5
    max_retry_time: Duration = 120.0
    queue_size: Int = Field(1000, ge=1, le=100_000)


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


HeaderName = Annotated[
    str, BeforeValidator(_lower), Field(max_length=100, pattern=r"^[a-z0-9!#$%&'*+.^_`|~-]+$")
]


class AuthzConfig(Frozen):
    """ext_authz admission (docs/design.md §5.3); each key is explained on ``AuthzSettings``."""

    enabled: bool = True
    cluster_key: str = Field("llm_cluster", min_length=1, max_length=100)
    cluster_header: HeaderName = "x-llm-cluster"
    probe_header: Literal["strip", "deny"] = "strip"
    probe_header_name: HeaderName = "x-llm-probe"
    shed_below: Number = Field(0.5, ge=0, le=1)
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


class Config(Frozen):
    server: ServerConfig = Field(default_factory=ServerConfig)
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    xds: XdsConfig = Field(default_factory=XdsConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    authz: AuthzConfig = Field(default_factory=AuthzConfig)
    hds: HdsConfig = Field(default_factory=HdsConfig)
    dns: DnsConfig = Field(default_factory=DnsConfig)
    fleet: FleetConfig | None = None
    remediation: tuple[RemediationConfig, ...] = Field((), max_length=50)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    clusters: tuple[ClusterConfig, ...] = Field(min_length=1, max_length=MAX_CLUSTERS)

    @field_validator("clusters")
    @classmethod
    def _endpoints_bounded(cls, value: tuple[ClusterConfig, ...]) -> tuple[ClusterConfig, ...]:
        total = sum(len(c.endpoints) for c in value)
        if total > MAX_ENDPOINTS:
            raise ValueError(f"{total} endpoints in all; at most {MAX_ENDPOINTS} are allowed")
        return value

    def probe_for(self, cluster: ClusterConfig) -> ProbeSettings:
        """The cluster's effective probe settings: defaults, then its overrides."""
        # Unset keys inherit; a key set to null overrides only where null means something
        # (e.g. ``engine_metrics: {path: null}`` turns the scrape off for one cluster).
        overrides = {
            key: value
            for key, value in cluster.probe.model_dump(exclude_unset=True).items()
            if value is not None or key in _NULLABLE_PROBE_KEYS
        }
        if cluster.model and "model" not in overrides:
            overrides["model"] = cluster.model
        merged = self.probe.model_dump()
        for key, value in overrides.items():
            inherited = merged.get(key)
            # A section (verify, engine_metrics) merges key by key with the top level's.
            if key in _SECTIONS and isinstance(value, dict) and isinstance(inherited, dict):
                value = {**inherited, **value}
            merged[key] = value
        return ProbeSettings.model_validate(_unsecret(merged), context=MERGING)

    def probe_targets(self, discovered: Discovered | None = None) -> list[ProbeTarget]:
        """One ProbeTarget per endpoint (configured, then ``discovered`` ones not also
        configured), with its cluster's effective settings."""
        secrets = self.secret_values()
        targets: list[ProbeTarget] = []
        for cluster in self.clusters:
            settings = self.probe_for(cluster)
            targets.extend(
                settings.to_target(cluster.name, e.address, secrets)
                for e in self._endpoints_of(cluster, discovered)
            )
        return targets

    def traffic_settings(
        self,
    ) -> dict[str, tuple[QualitySettings | None, BusySettings | None]]:
        """Per cluster: its ``probe.quality`` and ``probe.backoff_when_busy`` (None: off)."""
        found = {}
        for cluster in self.clusters:
            probe = self.probe_for(cluster)
            quality = probe.quality.to_settings() if probe.quality is not None else None
            busy = probe.backoff_when_busy
            found[cluster.name] = (quality, busy.to_settings() if busy is not None else None)
        return found

    def discoveries(self) -> tuple[DiscoverySettings, ...]:
        """Every cluster's discovery, in domain form."""
        return tuple(
            c.discovery.to_settings(c.name) for c in self.clusters if c.discovery is not None
        )

    def secret_values(self) -> frozenset[str]:
        """Every secret this config holds (``SecretStr`` values anywhere: probe and webhook
        headers, tokens; credentials in webhook URLs), in the forms to redact
        (``model.redact.secret_forms``)."""
        return secret_forms(_secrets_in(self))

    def cluster_specs(self, discovered: Discovered | None = None) -> tuple[ClusterSpec, ...]:
        """The board's clusters: configured endpoints, then ``discovered`` ones (cluster ->
        endpoints from DNS) whose address is not also configured: the same address twice
        is one endpoint, the configured one (its weight)."""
        return tuple(
            ClusterSpec(c.name, self.probe_for(c).to_policy(), self._endpoints_of(c, discovered))
            for c in self.clusters
        )

    @staticmethod
    def _endpoints_of(
        cluster: ClusterConfig, discovered: Discovered | None
    ) -> tuple[EndpointSpec, ...]:
        static = tuple(e.to_spec() for e in cluster.endpoints)
        found = (discovered or {}).get(cluster.name, ()) if cluster.discovery else ()
        if not found:
            return static
        configured = {e.address for e in static}
        return static + tuple(e for e in found if e.address not in configured)


def _secrets_in(value: Any) -> Iterator[str]:
    """Every SecretStr value and URL password in a validated model tree."""
    if isinstance(value, SecretStr):
        secret = value.get_secret_value()
        yield secret
        if "://" in secret:  # a secret URL (fleet.redis): its password alone too
            yield from _secrets_in(secret)
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _secrets_in(getattr(value, name))
    elif isinstance(value, dict):
        for item in value.values():
            yield from _secrets_in(item)
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _secrets_in(item)
    elif isinstance(value, str) and "://" in value:
        password = urlsplit(value).password
        if password:
            yield password


def _unsecret(data: dict[str, Any]) -> dict[str, Any]:
    headers = data.get("headers") or {}
    plain = {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in headers.items()}
    return {**data, "headers": plain}
