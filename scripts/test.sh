#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs (venv, dev extras, Debian
# chromium/nginx/promtool), starts Redis if it is down, then runs pytest (unit, integration,
# e2e; the long reliability scenarios are opt-in: scripts/reliability.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh dev
for s in install-browser.sh install-nginx.sh install-promtool.sh; do
  [[ -x scripts/$s ]] && scripts/$s
done
scripts/ensure-redis.sh
export CHUNLIAN_TORCH_THREADS=${CHUNLIAN_TORCH_THREADS:-1}
# The browser tests run in their own pytest process, after the rest: Playwright's sync API
# holds an event loop in the main thread, which asyncio tests must not inherit.
.venv/bin/python -m pytest -q -m "not slow" -p no:cacheprovider --ignore=tests/e2e "$@"
exec .venv/bin/python -m pytest -q -m "not slow" -p no:cacheprovider tests/e2e "$@"
