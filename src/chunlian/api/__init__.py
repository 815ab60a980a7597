"""The HTTP service: ``create_app`` builds the FastAPI app, ``serve`` runs it with uvicorn.

Layout (one idea per module): ``schemas`` (the API's shapes), ``routes`` (handlers),
``service`` (cache in front of the engine), ``runtime`` (start-up, readiness, shut-down),
``errors`` (errors to HTTP), ``middleware`` (request ids, limits, access log),
``metrics`` (Prometheus), ``warmup`` (start-up and remote warm-up), ``app`` (wiring).
"""

from __future__ import annotations

import logging

from chunlian.api.app import create_app
from chunlian.config import Settings

__all__ = ["create_app", "serve"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_HEADER_BYTES = 16 * 1024


def configure_logging(level: str) -> None:
    """Plain one-line logs on stderr at ``level`` for chunlian's loggers."""
    logging.basicConfig(level=level, format=LOG_FORMAT)
    logging.getLogger("chunlian").setLevel(level)


def serve(settings: Settings) -> None:
    """Run the service in this process (one uvicorn worker) until SIGTERM/SIGINT, which
    drain it (``api.drain``) before it exits 0.

    Raises ``SystemExit(3)`` when start-up fails (e.g. the model cannot be loaded).
    """
    import uvicorn

    from chunlian.omp import set_spin_wait

    # before the engine imports torch; alone on its cores unless told (chunlian.omp says why)
    set_spin_wait(settings.omp_spin, shared=False)
    configure_logging(settings.log_level)
    from chunlian.api.drain import DrainingServer

    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        lifespan="on",
        log_level=settings.log_level.lower(),
        access_log=False,  # the service middleware logs each request with its request id
        server_header=False,
        timeout_graceful_shutdown=5,  # after the drain (api.drain) nothing is left to wait for
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )
    runtime = app.state.runtime
    server = DrainingServer(config, runtime.drain, runtime.begin_drain, settings.drain_timeout_s)
    server.run()
    if not server.started:
        raise SystemExit(3)
