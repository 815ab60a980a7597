#!/usr/bin/env bash
# Start chunlian on embedded defaults (in-process cache, in-process jobs; no Redis needed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/chunlian serve "$@"
