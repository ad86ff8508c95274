"""The plugin's HTTP port: /livez, /readyz, /status, /metrics (DESIGN §5). Thin: reads the runtime."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from llm_health.config import split_address

ReadyFn = Callable[[], list[str]]
StatusFn = Callable[[], dict[str, Any]]
MetricsFn = Callable[[], Awaitable[tuple[bytes, str]]]  # (body, content type)


def build_http_app(
    ready_problems: ReadyFn, status: StatusFn, metrics: MetricsFn | None = None
) -> web.Application:
    """``ready_problems`` returns why we are not ready (empty list: ready).
    ``metrics``: the Prometheus exposition for /metrics (absent: no /metrics route)."""

    async def livez(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        problems = ready_problems()
        if problems:
            return web.json_response({"ready": False, "waiting_for": problems}, status=503)
        return web.json_response({"ready": True})

    async def status_handler(_request: web.Request) -> web.Response:
        return web.json_response(status(), dumps=_dumps)

    app = web.Application()
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status_handler)
    if metrics is not None:
        render = metrics

        async def metrics_handler(_request: web.Request) -> web.Response:
            body, content_type = await render()
            return web.Response(body=body, headers={"Content-Type": content_type})

        app.router.add_get("/metrics", metrics_handler)
    return app


async def start_http(app: web.Application, bind: str) -> web.AppRunner:
    """Listen on ``host:port`` or ``unix:/path``; raises OSError if the address is taken."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site: web.BaseSite
    if bind.startswith("unix:"):
        site = web.UnixSite(runner, bind.removeprefix("unix:"))
    else:
        host, port = split_address(bind)
        site = web.TCPSite(runner, host, port, reuse_port=False)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return runner


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, indent=2)
