"""A real webhook receiver for alert tests: an aiohttp server on 127.0.0.1.

It records every request (attempts included) and answers by script: the first
``fail_first`` attempts of each event id get ``fail_status``, later ones 200; with
``hang=True`` it never answers (until ``stop``). Start and stop it in the test's loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.polling import WaitTimeout, wait_until_async


@dataclass(frozen=True)
class Received:
    body: dict[str, Any]
    headers: dict[str, str]
    status: int  # what the receiver answered (0: it hung)
    at: float  # time.monotonic()


class Receiver:
    def __init__(
        self,
        *,
        fail_first: int = 0,
        fail_status: int = 500,
        hang: bool = False,
        path: str = "/hook/secret-path-token",
    ) -> None:
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.hang = hang
        self.path = path
        self.requests: list[Received] = []
        self._attempts: Counter[str] = Counter()
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post(self.path, self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        headers = dict(request.headers)
        if self.hang:
            self.requests.append(Received(body, headers, 0, time.monotonic()))
            await self._release.wait()
            return web.Response(status=503)
        self._attempts[body["id"]] += 1
        status = self.fail_status if self._attempts[body["id"]] <= self.fail_first else 200
        self.requests.append(Received(body, headers, status, time.monotonic()))
        return web.json_response({"ok": status == 200}, status=status)

    def accepted(self) -> list[dict[str, Any]]:
        """Bodies the receiver answered 2xx: the deliveries."""
        return [r.body for r in self.requests if 200 <= r.status < 300]

    def attempts(self, event_id: str) -> int:
        return sum(1 for r in self.requests if r.body.get("id") == event_id)

    async def wait_accepted(self, count: int, within_s: float) -> list[dict[str, Any]]:
        try:
            await wait_until_async(
                lambda: len(self.accepted()) >= count, within_s, f"{count} deliveries"
            )
        except WaitTimeout as exc:
            raise WaitTimeout(
                f"{exc}: receiver got {len(self.accepted())} deliveries: "
                f"{[r.body.get('event') for r in self.requests]}"
            ) from None
        return self.accepted()
