#!/usr/bin/env bash
# The long reliability scenarios (overload with 2,000 connections for 60 s, Redis
# stopped for 10 s, a Celery worker SIGKILLed and the broker restarted mid-job, an instance
# killed behind nginx, client faults, >= 1,000 schemathesis requests, security basics),
# bounded to 10 minutes in all; writes the table to runs/reliability.md (git-ignored; --out elsewhere).
#   scripts/reliability.sh                  # the whole run
#   scripts/reliability.sh --only overload  # some scenarios (the table then holds only those)
#   scripts/reliability.sh --scale quick    # a few-minute smoke run of the runner itself
# Loopback only. Uses Redis dbs 8 and 9 (emptied) and 12 (nothing flushed); restarts the
# local Redis twice (once with SHUTDOWN SAVE, to restart the broker with its data).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh dev
[[ -x scripts/install-nginx.sh ]] && scripts/install-nginx.sh
scripts/ensure-redis.sh
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true  # 2,000 client connections plus the server's
# The runner bounds itself to 600 s; the outer timeout only guards against a hang.
exec timeout --kill-after=30 900 .venv/bin/python -m tests.reliability.harness "$@"
