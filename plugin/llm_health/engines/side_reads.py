"""The engine checks' own HTTP client (docs/design.md §14): bounded GETs on an endpoint
beside the probes (/metrics, /v1/models, the engines' info endpoints), with the probe's
headers (its auth) and marker. Its own session, not the prober's: a slow side read never
holds a probe's connection. At most MAX_CONCURRENT_READS at once, each within
MAX_SIDE_TIMEOUT_S and a size bound; what fails raises one of READ_ERRORS, whose text for
/status is ``read_error``.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

from llm_health.engines.detect import INFO_PATHS, answers_as
from llm_health.engines.metrics import MAX_DOCUMENT, MetricsError
from llm_health.engines.served_model import model_ids
from llm_health.model.redact import printable_line, redact_secrets
from llm_health.probe.client import PROBE_HEADER
from llm_health.probe.target import ProbeTarget

MAX_SIDE_TIMEOUT_S = 2.0  # a /metrics or /v1/models request
MAX_MODELS_BODY = 1024 * 1024  # bytes read at most
MAX_INFO_BODY = 256 * 1024
MAX_CONCURRENT_READS = 64
READ_ERRORS = (MetricsError, aiohttp.ClientError, OSError, TimeoutError, UnicodeError, ValueError)


def open_session() -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=MAX_SIDE_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=MAX_CONCURRENT_READS, enable_cleanup_closed=True)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, trust_env=False, auto_decompress=True
    )


class SideReads:
    """The reads, over one session (``open_session``)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        self._limits = asyncio.Semaphore(MAX_CONCURRENT_READS)

    async def metrics(self, target: ProbeTarget, path: str, interval_s: float) -> str:
        """The engine's /metrics document (within its interval); MetricsError unless 200."""
        timeout = min(interval_s, MAX_SIDE_TIMEOUT_S)
        status, body = await self._get(target, path, timeout, MAX_DOCUMENT)
        if status != 200:
            raise MetricsError(f"HTTP {status}")
        return body.decode("utf-8", "replace")

    async def models(self, target: ProbeTarget, path: str) -> tuple[str, ...]:
        """The model ids the endpoint's ``/v1/models`` lists, the endpoint's secrets
        removed (an id reaches the "model" signal's reason); ValueError unless 200."""
        status, body = await self._get(target, path, MAX_SIDE_TIMEOUT_S, MAX_MODELS_BODY)
        if status != 200:
            raise ValueError(f"HTTP {status}")
        return tuple(redact_secrets(i, target.secrets) for i in model_ids(json.loads(body)))

    async def engine(self, target: ProbeTarget) -> str | None:
        """The engine the first info endpoint that answers as its engine's says (in the
        order of ``detect.INFO_PATHS``), or None."""
        for path, engine, key in INFO_PATHS:
            try:
                status, body = await self._get(target, path, MAX_SIDE_TIMEOUT_S, MAX_INFO_BODY)
                if status != 200:
                    continue
                found = json.loads(body)
            except READ_ERRORS:
                continue
            if answers_as(found, key):
                return engine
        return None

    async def _get(
        self, target: ProbeTarget, path: str, within_s: float, limit: int
    ) -> tuple[int, bytes]:
        """GET ``path`` on the endpoint with the probe's headers (its auth), bounded."""
        headers = {**target.headers, PROBE_HEADER: "true"}
        url = target.base_url + path
        async with (
            self._limits,
            asyncio.timeout(within_s),
            self._session.get(url, headers=headers) as response,
        ):
            body = await response.content.read(limit)
            return response.status, body


def read_error(exc: BaseException, target: ProbeTarget) -> str:
    """A failed read for /status: one line, the endpoint's secrets removed."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, MetricsError) else str(exc)
    return printable_line(redact_secrets(text, target.secrets), 200)
