"""The FastAPI application factory and its lifespan.

``create_app(settings, engine=None)`` wires the pieces: the runtime (engine, cache,
metrics, readiness), the routes, the error handlers, the service middleware and the
campaign page. The lifespan loads the model before the port opens (a broken model fails
start-up loudly), then starts the engine and warms up in the background: ``/healthz``
answers at once, ``/readyz`` and the generation endpoints answer 503 until warm-up is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

import chunlian
from chunlian.api.cors import cors
from chunlian.api.errors import install_error_handlers
from chunlian.api.fastpath import PlainCoupletFastPath
from chunlian.api.jobs_routes import router as jobs_router
from chunlian.api.middleware import ServiceMiddleware
from chunlian.api.routes import WEB_DIR, router
from chunlian.api.runtime import Runtime
from chunlian.config import Settings
from chunlian.engine.client import EngineClient
from chunlian.jobs.backend import build_jobs
from chunlian.jobs.monitor import JobsMonitor

log = logging.getLogger("chunlian.api")

DESCRIPTION = """\
chunlian writes Spring Festival couplets (春联): give it a 上联 and it writes the 下联 and a
横批, or give it a name or a keyword and it composes a whole couplet.

Every error has the shape `{"error": {"code", "message", "field"}}`. Every response carries
`X-Request-Id` (yours, echoed, or a new one) and `X-Chunlian-Instance`.
"""


class ChunlianAPI(FastAPI):
    """FastAPI with the service's own layers in front for HTTP: request ids, size limits,
    metrics and the access log (``ServiceMiddleware``), then the fast path for plain
    couplet requests (``PlainCoupletFastPath``), then the framework.

    In front, not added with ``add_middleware``: inside, every request would also go through
    FastAPI's own layers first (its OpenTelemetry check reads the environment on every
    request, then the error, telemetry and body-limit wrappers), a noticeable share of a
    cache hit's CPU time (``docs/performance.md``); the fast path needs none of them.
    Everything the fast path does not answer still gets the whole framework."""

    front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.front is not None:
            await self.front(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def framework(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app without the front layers (the innermost layer of ``front``)."""
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, engine: EngineClient | None = None) -> FastAPI:
    """The service app; ``engine`` (already built, not started) replaces the one from settings."""
    runtime = Runtime(settings, engine)
    jobs = build_jobs(settings, lambda: runtime.service if runtime.serving else None)

    monitor = JobsMonitor(jobs.recent, settings.jobs_metrics_every_s)
    runtime.metrics.registry.register(monitor)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.load()
        runtime.start_background()
        watching = asyncio.get_running_loop().create_task(monitor.run())
        try:
            yield
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            await jobs.close()
            await runtime.shut_down()

    app = ChunlianAPI(
        title="chunlian", version=chunlian.__version__, description=DESCRIPTION, lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.jobs = jobs
    app.include_router(router)
    app.include_router(jobs_router)
    install_error_handlers(app)
    if WEB_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    inner: ASGIApp = PlainCoupletFastPath(app.framework, runtime=runtime)  # after the service checks
    cors_layer = cors(inner, settings.cors_origins) if settings.cors_origins else None
    app.front = ServiceMiddleware(
        cors_layer or inner,
        instance_id=settings.instance_id,
        body_limit=settings.body_limit_bytes,
        observe=runtime.metrics.observe_request,
        refusal_headers=cors_layer.refusal_headers if cors_layer else None,
        drain=runtime.drain,
    )
    return app
