"""The configuration schema (docs/design.md §6): pydantic models, frozen once validated.

The feature sections are defined in their own packages (``<feature>/settings.py``:
``probe.verify`` and ``probe.engine_metrics`` in ``engines``, ``probe.quality`` and
``probe.backoff_when_busy`` in ``traffic``, ``hds``, ``authz``, ``alerts``, ``admin``,
``fleet``, ``remediation``, ``dns`` and ``clusters[].discovery``) and are the types those
features receive; this module composes them into the whole file, with the sections that
belong to no one feature (server, xds, probe, clusters); the rules across fields and
sections are ``config.rules``, which the validators here raise.
Where a section builds a different domain type (``to_policy``: ``model.Policy``,
``to_target``: ``probe.ProbeTarget``) it is built here, in one place. Loading (YAML,
``${ENV}``, error lines) is ``config.loader``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import (
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

from llm_health.admin.settings import AdminConfig
from llm_health.alerts.settings import AlertsConfig
from llm_health.authz.settings import AuthzConfig
from llm_health.config import rules
from llm_health.config.rules import MAX_CLUSTERS, MAX_ENDPOINTS
from llm_health.core.addresses import is_ip_host, split_address
from llm_health.core.settings import (
    MERGING,
    Duration,
    Frozen,
    Headers,
    Int,
    Number,
    Token,
    UrlPath,
)
from llm_health.discovery.settings import DiscoveryConfig, DnsConfig
from llm_health.engines.settings import (
    ClusterChecks,
    EngineMetricsConfig,
    VerifyConfig,
    in_force,
)
from llm_health.fleet.settings import FleetConfig
from llm_health.hds.settings import HdsConfig
from llm_health.model.board import ClusterSpec, EndpointSpec
from llm_health.model.policy import Policy
from llm_health.model.redact import secret_forms
from llm_health.probe.loop import EventLoopSetting
from llm_health.probe.target import (
    DEFAULT_FATAL_PATTERNS,
    ProbeTarget,
    compile_fatal_patterns,
    endpoint_url,
)
from llm_health.remediation.settings import LimitsConfig, RemediationConfig
from llm_health.traffic.settings import BusyConfig, QualityConfig, busy_shorthand

MAX_FATAL_PATTERNS = 100
_V = TypeVar("_V")
Discovered = Mapping[str, tuple[EndpointSpec, ...]]  # cluster -> endpoints found in DNS


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
    backoff_when_busy: Annotated[BusyConfig | None, BeforeValidator(busy_shorthand)] = None
    prompt: str = Field("hi", min_length=1, max_length=200)
    model: str | None = Field(None, max_length=500)
    headers: Headers = Field(default_factory=dict)
    fatal_patterns: tuple[Annotated[str, Field(min_length=1, max_length=200)], ...] = Field(
        DEFAULT_FATAL_PATTERNS, max_length=MAX_FATAL_PATTERNS
    )

    @model_validator(mode="after")
    def _ttft_within_timeout(self) -> ProbeSettings:
        return _held_to(self, rules.ttft_within_timeout(self.healthy_ttft, self.timeout))

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
            models_path=self.models_path,
            fatal_patterns=compile_fatal_patterns(self.fatal_patterns),
            headers={k: v.get_secret_value() for k, v in self.headers.items()},
            # One frozenset shared by every target when the section adds no secret of
            # its own (a union makes a new one, 216 bytes, each time).
            secrets=own | secrets if own - secrets else secrets,
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


class ClusterConfig(Frozen):
    name: str = Field(min_length=1, max_length=200)
    model: str | None = Field(None, max_length=500)
    probe: ProbeOverrides = Field(default_factory=ProbeOverrides)
    endpoints: tuple[EndpointConfig, ...] = Field((), max_length=MAX_ENDPOINTS)
    discovery: DiscoveryConfig | None = None

    @model_validator(mode="after")
    def _has_endpoints(self) -> ClusterConfig:
        found = rules.endpoints_or_discovery(self.name, len(self.endpoints), bool(self.discovery))
        return _held_to(self, found)

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
        return _held_to(value, rules.weights_fit(e.weight for e in value))


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
    # ext_authz on a gRPC server of its own (docs/design.md §16.9): admission never waits
    # for the event loop that times the probes. null: on ``grpc`` with everything else.
    # Same token and TLS as ``grpc``. Applies at start.
    authz: str | None = None
    # Where that server runs: "process", a child process fed the health view over a pipe
    # (its own interpreter, so never behind the prober's); "threads", threads of this one.
    authz_isolation: Literal["process", "threads"] = "process"
    token: Token | None = None
    tls: ServerTlsConfig | None = None
    # Probe worker processes (docs/design.md §16.2): 0 probes on the runtime's own loop;
    # "auto" starts one per core this process may run on. Applies at start.
    probe_workers: Annotated[int | str, PlainValidator(_probe_workers)] = 0
    # The event loop of ``serve`` and its probe workers (docs/design.md §16.10): "auto" is
    # uvloop when installed (it is a dependency); "asyncio" the standard loop. At start.
    event_loop: EventLoopSetting = "auto"

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

    @model_validator(mode="after")
    def _authenticated_off_loopback(self) -> ServerConfig:
        mtls = self.tls is not None and self.tls.client_ca is not None
        authenticated = self.token is not None or mtls
        found = rules.server_reachable(self.grpc, self.http, self.authz, authenticated)
        return _held_to(self, found)


class XdsConfig(Frozen):
    coalesce: Duration = 0.02
    warm_start_timeout: Duration = 5.0


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
        return _held_to(value, rules.endpoints_total(sum(len(c.endpoints) for c in value)))

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

    def traffic_settings(self) -> dict[str, tuple[QualityConfig | None, BusyConfig | None]]:
        """Per cluster: its ``probe.quality`` and ``probe.backoff_when_busy`` (None: off)."""
        found = {}
        for cluster in self.clusters:
            probe = self.probe_for(cluster)
            found[cluster.name] = (probe.quality, probe.backoff_when_busy)
        return found

    def engine_checks(self) -> dict[str, ClusterChecks]:
        """Per cluster: its ``probe.verify`` and ``probe.engine_metrics`` in force (None:
        off)."""
        found = {}
        for cluster in self.clusters:
            probe = self.probe_for(cluster)
            found[cluster.name] = in_force(probe.verify, probe.engine_metrics)
        return found

    def discovery(self) -> tuple[DnsConfig, dict[str, DiscoveryConfig]]:
        """What ``DiscoveryComponent`` reads: ``dns`` and ``discoveries()``."""
        return self.dns, self.discoveries()

    def discoveries(self) -> dict[str, DiscoveryConfig]:
        """Every cluster's ``discovery:`` by the cluster's name (the section, under
        ``clusters[]``, does not carry it), in the file's order."""
        return {c.name: c.discovery for c in self.clusters if c.discovery is not None}

    def secret_values(self) -> frozenset[str]:
        """Every secret this config holds (``SecretStr`` values anywhere: probe and webhook
        headers, tokens; credentials in webhook URLs), in the forms to redact
        (``model.redact.secret_forms``)."""
        return secrets_of(self)

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


def _held_to(value: _V, problem: str | None) -> _V:
    """``value`` if a rule (``config.rules``) found no problem; else the validator fails
    with the rule's words."""
    if problem is not None:
        raise ValueError(problem)
    return value


def secrets_of(model: BaseModel) -> frozenset[str]:
    """Every secret a validated file model holds, in the forms to redact."""
    return secret_forms(_secrets_in(model))


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
