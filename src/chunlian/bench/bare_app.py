"""``python -m chunlian.bench.bare_app PORT``: the reference for ``chunlian bench service``.

A bare FastAPI app with one POST route that parses the same JSON body and returns a constant
couplet of the same shape, served by the same uvicorn configuration as chunlian (one worker,
no access log). What chunlian's cache-hit path costs on top of this is the service's own
overhead: validation, middleware, cache lookup, metrics.
"""

from __future__ import annotations

import sys
from typing import Any

from fastapi import FastAPI

CONSTANT: dict[str, Any] = {
    "upper": "春回大地千山秀", "lower": "福满人间万户春", "hengpi": "万象更新",
    "style": "traditional", "cached": True, "model": "bare@0",
}


def create_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/couplets")
    async def couplet(body: dict[str, Any]) -> dict[str, Any]:
        return CONSTANT

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main() -> None:
    import uvicorn

    port = int(sys.argv[1])
    uvicorn.run(create_app(), host="127.0.0.1", port=port, workers=1, access_log=False,
                server_header=False, log_level="warning")


if __name__ == "__main__":
    main()
