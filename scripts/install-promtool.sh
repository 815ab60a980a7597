#!/usr/bin/env bash
# Install promtool (to check deploy/prometheus/*.yml) from the Debian package `prometheus`.
#
# Idempotent and quiet: does nothing when promtool is already on PATH. Never starts the
# Prometheus server: while the package installs, a policy-rc.d that forbids starting
# services is put in place (unless one is there already) and removed afterwards; on hosts
# run by systemd the unit is left disabled and stopped.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-promtool.sh: need root (or sudo) to install the prometheus package" >&2; exit 1
  fi
fi

policy=/usr/sbin/policy-rc.d
placed=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  placed=1
fi
cleanup() { if [ "$placed" -eq 1 ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT

echo "install-promtool.sh: installing prometheus (for promtool)" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null

if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
promtool --version >&2
