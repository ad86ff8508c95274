"""What ``admin:`` configures (docs/design.md §5.4): the section itself, the type the admin
component receives. The token is the same type as ``server.token`` (``core.settings.Token``):
both travel as gRPC metadata."""

from __future__ import annotations

from pydantic import field_validator, model_validator

from llm_health.core.addresses import is_local_bind, split_address
from llm_health.core.settings import Frozen, Token


class AdminConfig(Frozen):
    """The admin gRPC API (llm_health.v1.Admin). ``grpc`` unset: served on server.grpc.
    A non-loopback ``grpc`` needs ``token``; with a token every call must present it."""

    grpc: str | None = None
    token: Token | None = None

    @field_validator("grpc")
    @classmethod
    def _valid_bind(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("unix:"):
            split_address(value)
        return value

    @model_validator(mode="after")
    def _token_off_loopback(self) -> AdminConfig:
        if self.grpc is not None and self.token is None and not is_local_bind(self.grpc):
            raise ValueError(
                f'grpc "{self.grpc}" is not a loopback address: set admin.token '
                '(e.g. token: "${LLM_HEALTH_ADMIN_TOKEN}") or bind 127.0.0.1'
            )
        return self

    @property
    def own_token_on_shared_port(self) -> bool:
        """The API is served on ``server.grpc`` and checks its own ``token`` there: the
        port's shared token check lets its calls through (``servers.auth.GrpcAuth``)."""
        return self.token is not None and self.grpc is None
