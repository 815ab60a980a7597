"""``POST /v1/couplets`` served by LitServe on the shipped weights: the peer of
``benchmarks/litserve_peer.py``.

    pip install -e '.[peer]'
    python benchmarks/litserve_app.py --port 8100 --workers 2 --threads 1 --max-batch-size 64

Each LitServe inference worker (``--workers`` processes on the CPU) loads the weights into
chunlian's own ``OfflineGenerator`` (one ``ModelRunner`` of ``--max-batch-size`` rows) and
answers each batch LitServe's dynamic batching gathers (up to ``--max-batch-size`` requests,
waiting at most ``--batch-timeout-s``) with one ``generate`` call. Requests take the service's
body (``upper``, ``style``, ``seed``) and answer its shape (``upper``, ``lower``, ``hengpi``,
``style``, ``cached``, ``model``). Nothing is cached.
"""

import argparse
from typing import Any

import litserve as ls
from fastapi import HTTPException

ENDPOINT = "/v1/couplets"


class CoupletAPI(ls.LitAPI):  # type: ignore[misc]
    """One inference worker: the shipped weights behind ``OfflineGenerator.generate``."""

    def __init__(self, threads: int, rows: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.threads, self.rows = threads, rows

    def setup(self, device: str) -> None:
        import torch

        from chunlian.offline import OfflineGenerator

        torch.set_num_threads(self.threads)
        self.gen = OfflineGenerator.load(device="cpu", capacity=self.rows)

    # no annotations on decode_request's argument nor encode_response's result: LitServe turns
    # them into FastAPI's request and response types; without them it reads the body as JSON
    # and returns the dict as is, its default path
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        from chunlian.errors import ChunlianError
        from chunlian.offline import couplet_request

        try:
            return couplet_request(request["upper"], request.get("style", "traditional"),
                                   seed=request.get("seed"))
        except (KeyError, TypeError, ChunlianError) as e:
            raise HTTPException(422, str(e)) from e

    def batch(self, inputs: list[Any]) -> list[Any]:
        return inputs

    def predict(self, requests: list[Any]) -> list[Any]:
        return self.gen.generate(requests)

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output

    def encode_response(self, result):  # type: ignore[no-untyped-def]
        from chunlian.errors import ChunlianError

        if isinstance(result, ChunlianError):
            raise HTTPException(422, str(result))
        return {**result.best.as_dict(), "cached": False, "model": result.model}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", type=int, default=2, help="inference worker processes on the CPU")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each worker")
    p.add_argument("--max-batch-size", type=int, default=64, help="requests one worker batches")
    p.add_argument("--batch-timeout-s", type=float, default=0.005, help="longest wait for a batch to fill")
    p.add_argument("--api-servers", type=int, default=None,
                   help="HTTP server processes (default: LitServe's, one per inference worker)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="longest wait in LitServe's queue (504 past it)")
    p.add_argument("--fast-queue", action="store_true", help="LitServe's ZeroMQ queues")
    a = p.parse_args()
    api = CoupletAPI(a.threads, a.max_batch_size, max_batch_size=a.max_batch_size,
                     batch_timeout=a.batch_timeout_s, api_path=ENDPOINT)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=a.workers,
                          timeout=a.timeout_s, fast_queue=a.fast_queue)
    server.run(host="127.0.0.1", port=a.port, num_api_servers=a.api_servers, log_level="warning",
               generate_client_file=False)


if __name__ == "__main__":
    main()
