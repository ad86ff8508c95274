"""What becomes a probe's verdict and what is a bug of ours (``probe._exchange``): a
target that cannot make a request is the endpoint's ERROR; a ValueError from our own
code reaches the caller, never the endpoint's record."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

import pytest

from llm_health.config.schema import ProbeSettings
from llm_health.model.outcome import Outcome
from llm_health.probe.client import MicroProbe, new_connections
from llm_health.probe.http1 import UnsendableRequest, route_of
from llm_health.probe.target import ProbeTarget
from tests.started import probe_once


def target(**settings: object) -> ProbeTarget:
    return ProbeSettings(model="m", prompt="hi", **settings).to_target("c", "127.0.0.1:1")  # type: ignore[arg-type]


class BrokenEngines(Mapping[str, str]):
    """The engines a feature detected, read by the request body: here, a bug of ours."""

    def __getitem__(self, key: str) -> str:
        raise ValueError("our own bug")

    def get(self, key: str, default: object = None) -> str:  # type: ignore[override]
        raise ValueError("our own bug")

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


async def test_a_value_error_of_our_own_is_no_endpoint_error() -> None:
    async with new_connections() as connections:
        prober = MicroProbe(connections, engines=BrokenEngines())
        with pytest.raises(ValueError, match="our own bug"):
            await probe_once(prober, target(engine="auto"))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:99999/v1/completions",  # a port out of range
        "http://[not-ipv6]/v1/completions",
        "ftp://127.0.0.1/v1/completions",
    ],
)
async def test_a_url_that_cannot_be_sent_is_the_endpoints_error(url: str) -> None:
    with pytest.raises(UnsendableRequest):
        route_of(url)
    async with new_connections() as connections:
        result = await probe_once(MicroProbe(connections), dataclasses.replace(target(), url=url))
    assert result.outcome is Outcome.ERROR
    assert url in result.detail
