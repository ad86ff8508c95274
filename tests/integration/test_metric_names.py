"""The golden list of /metrics families (``metric_names.txt`` beside this file, one
``name type`` a line, as the ``# TYPE`` lines write them): a real runtime with every
component active, scraped once over HTTP. A refactor that renames, drops or retypes a
series fails here; a new series goes into the list on purpose.

Components: admin (own port, token), alerts (a webhook nobody answers), ext_authz (own
port, in its own process; one Check is made, and counted, so that its per-rule family shows), HDS, DNS discovery
(a nameserver nobody answers: the cluster is watched and failing), remediation, passive
traffic, engine checks (verify, engine /metrics, served model) and fleet (a Redis nobody
answers: fallback mode, so nothing needs Redis at scrape time). The probed endpoint
refuses connections; nothing here waits for a verdict.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc

from tests.polling import wait_until_async
from tests.ports import free_port
from tests.runtime import Running

pytestmark = pytest.mark.timeout(30)

GOLDEN = Path(__file__).with_name("metric_names.txt")
CONFIG = """
server: {{grpc: "127.0.0.1:{grpc}", http: "127.0.0.1:{http}", authz: "127.0.0.1:{authz}"}}
admin: {{grpc: "127.0.0.1:{admin}", token: "golden-admin-token-0123456789"}}
alerts: {{webhooks: [{{url: "http://127.0.0.1:{closed}/hook"}}], max_attempts: 1}}
dns: {{nameservers: ["127.0.0.1:{closed}"], timeout: 100ms}}
fleet: {{redis: "redis://127.0.0.1:{closed}/0", name: golden}}
remediation:
  - when: {{state: unhealthy, for: 1h}}
    run: ["/bin/true"]
probe: {{interval: 200ms, timeout: 150ms, healthy_ttft: 100ms, model: golden-model}}
clusters:
  - name: llama
    endpoints: [{{address: "127.0.0.1:{closed}"}}]
  - name: found
    discovery: {{dns: "llm.golden.example", port: 8000}}
"""


def expected_families() -> set[str]:
    lines = set(GOLDEN.read_text(encoding="utf-8").split("\n")) - {""}
    if not Path("/proc/self/stat").exists():  # prometheus_client's process_* need /proc
        lines = {line for line in lines if not line.startswith("process_")}
    return lines


def families(exposition: str) -> list[str]:
    """``name type`` of every family, from the exposition's ``# TYPE`` lines."""
    return [
        " ".join(line.split()[2:4])
        for line in exposition.splitlines()
        if line.startswith("# TYPE ")
    ]


def check(port: int) -> None:
    """One ext_authz Check for cluster llama (blocking: run it in a thread)."""
    request = external_auth_pb2.CheckRequest()
    request.attributes.context_extensions["llm_cluster"] = "llama"
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        external_auth_pb2_grpc.AuthorizationStub(channel).Check(request, timeout=5)


def statuses(running: Running) -> dict[str, Any]:
    return {c.name: c.status() for c in running.runtime.components}


async def scrape(port: int) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        return await response.text()


async def test_metric_families_match_the_golden_list() -> None:
    ports = {name: free_port() for name in ("grpc", "http", "authz", "admin", "closed")}
    running = Running.from_config(CONFIG.format(**ports))
    async with running:

        def started() -> bool:
            found = statuses(running)
            return bool(
                found["discovery"]["clusters"]
                and found["engines"]["endpoints"]
                and found["authz"]["own_server"]["serving"]
            )

        await wait_until_async(started, 10, "discovery, engine checks and ext_authz to start")
        await asyncio.to_thread(check, ports["authz"])
        await wait_until_async(  # the admission process reports its counters 4 times a second
            lambda: bool(statuses(running)["authz"]["decisions"]), 5, "the Check counted"
        )
        exposition = await scrape(ports["http"])
    found = families(exposition)
    assert len(found) == len(set(found)), f"a family is exposed twice: {sorted(found)}"
    expected = expected_families()
    assert set(found) == expected, (
        f"not in {GOLDEN.name}: {sorted(set(found) - expected)}; "
        f"gone: {sorted(expected - set(found))}"
    )
