#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs (venv, dev extras, Debian
# chromium/nginx/promtool, podman/mmdebstrap/docker-compose), starts Redis if it is down, then
# runs pytest (unit, integration, container, e2e; the long reliability scenarios are opt-in:
# scripts/reliability.sh), after lint-imports (the import contracts). The container tests (-m container) build the image with podman
# (the base image and layers are cached between runs: the first run takes a few minutes more);
# where podman cannot start containers the run ends with one line saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh dev
for s in install-browser.sh install-nginx.sh install-promtool.sh; do
  [[ -x scripts/$s ]] && scripts/$s
done
# podman & co.: when they cannot be installed the container tests say so (never pass silently)
scripts/install-containers.sh || echo "test.sh: scripts/install-containers.sh failed: the container tests will report it" >&2
scripts/ensure-redis.sh
export CHUNLIAN_TORCH_THREADS=${CHUNLIAN_TORCH_THREADS:-1}
# the import contracts in pyproject.toml: layers point one way, no circles
.venv/bin/lint-imports
# The browser tests run in their own pytest process, after the rest: Playwright's sync API
# holds an event loop in the main thread, which asyncio tests must not inherit.
.venv/bin/python -m pytest -q -m "not slow" -p no:cacheprovider --ignore=tests/e2e "$@"
exec .venv/bin/python -m pytest -q -m "not slow" -p no:cacheprovider tests/e2e "$@"
