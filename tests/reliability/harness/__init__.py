"""Reliability scenarios: overload, faults and hostile input against real processes.

Every scenario is a function that drives a real service (a ``python -m chunlian.api`` child
process, or an in-process uvicorn whose engine a test can park) over loopback and returns an
``Outcome``: requests sent / answered / rejected / failed, items lost, and the list of broken
promises (``problems``; empty when the scenario passed). The CI suite
(``tests/reliability``) calls them with small loads; ``python -m tests.reliability.harness``
(``scripts/reliability.sh``) runs the long versions, bounded to 10 minutes in all, and
writes its report to ``runs/reliability.md`` (``docs/reliability.md`` cites a run).

Scenarios (numbered as in the issue):

1. ``overload``: N concurrent keep-alive connections against one instance with a small
   queue; clients honour ``Retry-After``. No 5xx but 504; every rejection a 429 with
   ``Retry-After``; every answer within its deadline plus a margin by the service's own clock
   (the middleware's latency histogram; the client's view is reported too); server RSS
   growth (``/proc/<pid>/status`` VmRSS) after a warm-up phase under 10 %; ready, answering,
   and no engine slot left taken afterwards.
2. ``redis_fault``: steady load while Redis is shut down and restarted (always restarted).
   No failed request; the bypass is counted (``chunlian_cache_requests_total{store="redis",
   result="error"}`` or ``chunlian_redis_up 0``); Redis hits resume after the restart.
3. ``worker_fault``: a Celery worker SIGKILLed in the middle of a 2,000-item job and
   another started, then the broker restarted: every item exactly once.
4. ``instance_fault``: one of two instances behind nginx killed under load: no failed
   idempotent request.
5. ``client_faults``: clients that disconnect while queued and while generating (cancelled
   and counted), slowloris clients (others are still served), and requests whose deadline
   passes while queued (504, counted as deadline drops, never prefilled).
6. ``bad_input``: fixed hostile cases (raw bytes, lone surrogates, 10 MB bodies, deeply
   nested JSON, wrong content types, ...), hypothesis over the text fields, and schemathesis
   over ``/openapi.json``: zero 5xx, every rejection a 4xx in the error shape.
7. ``security``: body and header limits, hashed cache keys, API keys on the job
   endpoints, no internals in error bodies, request ids (and never keys) in the logs.

Loops are bounded in count and time and stop by themselves; only loopback is used.

Modules: ``common`` (constants, ``Outcome``, a raw HTTP/1.1 client, checks on replies,
``/metrics`` and ``/proc``), ``services`` (the processes driven, Redis), one module per
scenario, ``report`` (the long run within its budget, and its Markdown report).
"""

from __future__ import annotations

from tests.reliability.harness.bad_input import (
    bad_input,
    check_hostile_reply,
    encode_body,
    fixed_cases,
    hostile_cases,
    hostile_request_strategy,
    run_schemathesis,
)
from tests.reliability.harness.client_faults import disconnects, queued_deadlines, slow_clients
from tests.reliability.harness.common import (
    CLUSTER_REDIS_DB,
    HAN_RE,
    HOST,
    JOBS_REDIS_DB,
    REDIS_PORT,
    SECURITY_REDIS_DB,
    Outcome,
)
from tests.reliability.harness.instance_faults import instance_fault
from tests.reliability.harness.overload import overload
from tests.reliability.harness.redis_fault import redis_fault
from tests.reliability.harness.report import (
    API_KEYS,
    drop_queue,
    main,
    main_service_settings,
    run_all,
)
from tests.reliability.harness.security import security
from tests.reliability.harness.services import (
    InProcessService,
    ServiceProcess,
    flush_db,
    redis_pings,
    start_redis,
    stop_redis,
)
from tests.reliability.harness.worker_faults import cluster_available, jobs_available, worker_fault

__all__ = [
    "API_KEYS",
    "CLUSTER_REDIS_DB",
    "HAN_RE",
    "HOST",
    "InProcessService",
    "JOBS_REDIS_DB",
    "Outcome",
    "REDIS_PORT",
    "SECURITY_REDIS_DB",
    "ServiceProcess",
    "bad_input",
    "check_hostile_reply",
    "cluster_available",
    "disconnects",
    "drop_queue",
    "encode_body",
    "fixed_cases",
    "flush_db",
    "hostile_cases",
    "hostile_request_strategy",
    "instance_fault",
    "jobs_available",
    "main",
    "main_service_settings",
    "overload",
    "queued_deadlines",
    "redis_fault",
    "redis_pings",
    "run_all",
    "run_schemathesis",
    "security",
    "slow_clients",
    "start_redis",
    "stop_redis",
    "worker_fault",
]
