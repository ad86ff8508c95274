"""Records left out of an answer are logged when they change, at most once a minute: a
DNS server whose answer changes at every refresh cannot grow the log (docs/design.md §10)."""

from __future__ import annotations

import logging

import pytest

from llm_health.core.settings import MERGING
from llm_health.discovery.answers import Found
from llm_health.discovery.settings import DiscoveryConfig
from llm_health.discovery.watcher import Watcher
from llm_health.model.board import EndpointSpec

ENDPOINT = EndpointSpec("127.0.0.1:8000", "127.0.0.1", 8000, 100)
SETTINGS = DiscoveryConfig.model_validate({"dns": "a.test", "port": 8000}, context=MERGING)


async def test_changing_left_out_records_log_once(caplog: pytest.LogCaptureFixture) -> None:
    answers = iter(range(1_000))

    async def resolve(_settings: DiscoveryConfig) -> Found:
        n = next(answers)
        return Found((ENDPOINT,), 0, (f"{n} SRV targets came without addresses: ...",))

    async def found(_cluster: str, _endpoints: tuple[EndpointSpec, ...]) -> None:
        return None

    watcher = Watcher("c", SETTINGS, resolve, found, lambda _cluster, _fault: None)
    caplog.set_level(logging.WARNING, logger="llm_health")
    for _ in range(200):
        await watcher.resolve_once()
    lines = [r for r in caplog.records if r.getMessage() == "DNS discovery: records left out"]
    assert len(lines) == 1
    assert watcher.status(0.0)["dropped"] == ["199 SRV targets came without addresses: ..."]
