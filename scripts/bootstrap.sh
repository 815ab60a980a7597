#!/usr/bin/env bash
# Create .venv (if missing) and install chunlian into it. Usage: scripts/bootstrap.sh [dev]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
extra=""
[[ "${1:-}" == "dev" ]] && extra="[dev]"
stamp=".venv/.chunlian-installed${extra}"
if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch is pinned in pyproject.toml (CPU build from the local wheel here; never unpinned)
  .venv/bin/python -m pip install -q -e ".${extra}"
  touch "$stamp"
fi
