import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_UNSPECIFIED: _ClassVar[State]
    STATE_STARTING: _ClassVar[State]
    STATE_HEALTHY: _ClassVar[State]
    STATE_DEGRADED: _ClassVar[State]
    STATE_UNHEALTHY: _ClassVar[State]
    STATE_DRAINING: _ClassVar[State]

class EnvoyHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENVOY_HEALTH_UNSPECIFIED: _ClassVar[EnvoyHealth]
    ENVOY_HEALTH_HEALTHY: _ClassVar[EnvoyHealth]
    ENVOY_HEALTH_UNHEALTHY: _ClassVar[EnvoyHealth]
    ENVOY_HEALTH_DRAINING: _ClassVar[EnvoyHealth]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_FAST: _ClassVar[Outcome]
    OUTCOME_SLOW: _ClassVar[Outcome]
    OUTCOME_OVERLOADED: _ClassVar[Outcome]
    OUTCOME_TIMEOUT: _ClassVar[Outcome]
    OUTCOME_FATAL: _ClassVar[Outcome]
    OUTCOME_ERROR: _ClassVar[Outcome]
STATE_UNSPECIFIED: State
STATE_STARTING: State
STATE_HEALTHY: State
STATE_DEGRADED: State
STATE_UNHEALTHY: State
STATE_DRAINING: State
ENVOY_HEALTH_UNSPECIFIED: EnvoyHealth
ENVOY_HEALTH_HEALTHY: EnvoyHealth
ENVOY_HEALTH_UNHEALTHY: EnvoyHealth
ENVOY_HEALTH_DRAINING: EnvoyHealth
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_FAST: Outcome
OUTCOME_SLOW: Outcome
OUTCOME_OVERLOADED: Outcome
OUTCOME_TIMEOUT: Outcome
OUTCOME_FATAL: Outcome
OUTCOME_ERROR: Outcome

class ProbeResult(_message.Message):
    __slots__ = ("outcome", "started_at", "ttft_ms", "connect_ms", "headers_ms", "total_ms", "http_status", "detail", "loop_lag_ms")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    CONNECT_MS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    LOOP_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    started_at: float
    ttft_ms: float
    connect_ms: float
    headers_ms: float
    total_ms: float
    http_status: int
    detail: str
    loop_lag_ms: float
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., started_at: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., connect_ms: _Optional[float] = ..., headers_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., http_status: _Optional[int] = ..., detail: _Optional[str] = ..., loop_lag_ms: _Optional[float] = ...) -> None: ...

class Endpoint(_message.Message):
    __slots__ = ("cluster", "address", "host", "port", "base_weight", "state", "reason", "since", "envoy_health", "envoy_weight", "lb_label", "last_probe", "probe_state", "signals", "override_until", "removing", "cause")
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    BASE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    ENVOY_HEALTH_FIELD_NUMBER: _ClassVar[int]
    ENVOY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    LB_LABEL_FIELD_NUMBER: _ClassVar[int]
    LAST_PROBE_FIELD_NUMBER: _ClassVar[int]
    PROBE_STATE_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    REMOVING_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    address: str
    host: str
    port: int
    base_weight: int
    state: State
    reason: str
    since: float
    envoy_health: EnvoyHealth
    envoy_weight: int
    lb_label: str
    last_probe: ProbeResult
    probe_state: State
    signals: _containers.ScalarMap[str, str]
    override_until: float
    removing: bool
    cause: str
    def __init__(self, cluster: _Optional[str] = ..., address: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., base_weight: _Optional[int] = ..., state: _Optional[_Union[State, str]] = ..., reason: _Optional[str] = ..., since: _Optional[float] = ..., envoy_health: _Optional[_Union[EnvoyHealth, str]] = ..., envoy_weight: _Optional[int] = ..., lb_label: _Optional[str] = ..., last_probe: _Optional[_Union[ProbeResult, _Mapping]] = ..., probe_state: _Optional[_Union[State, str]] = ..., signals: _Optional[_Mapping[str, str]] = ..., override_until: _Optional[float] = ..., removing: bool = ..., cause: _Optional[str] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("name", "warm", "envoy_version", "endpoints")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WARM_FIELD_NUMBER: _ClassVar[int]
    ENVOY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    warm: bool
    envoy_version: str
    endpoints: _containers.RepeatedCompositeFieldContainer[Endpoint]
    def __init__(self, name: _Optional[str] = ..., warm: bool = ..., envoy_version: _Optional[str] = ..., endpoints: _Optional[_Iterable[_Union[Endpoint, _Mapping]]] = ...) -> None: ...

class EndpointKey(_message.Message):
    __slots__ = ("cluster", "address")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    address: str
    def __init__(self, cluster: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class ListEndpointsRequest(_message.Message):
    __slots__ = ("cluster",)
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    def __init__(self, cluster: _Optional[str] = ...) -> None: ...

class ListEndpointsResponse(_message.Message):
    __slots__ = ("revision", "clusters")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    def __init__(self, revision: _Optional[int] = ..., clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ...) -> None: ...

class WatchEndpointsRequest(_message.Message):
    __slots__ = ("cluster",)
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    def __init__(self, cluster: _Optional[str] = ...) -> None: ...

class WatchEndpointsResponse(_message.Message):
    __slots__ = ("revision", "initial", "clusters", "endpoints", "removed")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    INITIAL_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    revision: int
    initial: bool
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    endpoints: _containers.RepeatedCompositeFieldContainer[Endpoint]
    removed: _containers.RepeatedCompositeFieldContainer[EndpointKey]
    def __init__(self, revision: _Optional[int] = ..., initial: bool = ..., clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ..., endpoints: _Optional[_Iterable[_Union[Endpoint, _Mapping]]] = ..., removed: _Optional[_Iterable[_Union[EndpointKey, _Mapping]]] = ...) -> None: ...

class EndpointRequest(_message.Message):
    __slots__ = ("cluster", "address")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    address: str
    def __init__(self, cluster: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("cluster", "address", "reason")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    address: str
    reason: str
    def __init__(self, cluster: _Optional[str] = ..., address: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ForceStateRequest(_message.Message):
    __slots__ = ("cluster", "address", "state", "duration", "reason")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    address: str
    state: State
    duration: _duration_pb2.Duration
    reason: str
    def __init__(self, cluster: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[State, str]] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class EndpointResponse(_message.Message):
    __slots__ = ("endpoint", "changed")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    endpoint: Endpoint
    changed: bool
    def __init__(self, endpoint: _Optional[_Union[Endpoint, _Mapping]] = ..., changed: bool = ...) -> None: ...

class ProbeNowResponse(_message.Message):
    __slots__ = ("result", "endpoint", "ignored")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    IGNORED_FIELD_NUMBER: _ClassVar[int]
    result: ProbeResult
    endpoint: Endpoint
    ignored: bool
    def __init__(self, result: _Optional[_Union[ProbeResult, _Mapping]] = ..., endpoint: _Optional[_Union[Endpoint, _Mapping]] = ..., ignored: bool = ...) -> None: ...
