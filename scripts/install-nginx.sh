#!/usr/bin/env bash
# Install nginx (the Debian package) when the `nginx` binary is missing; idempotent.
# Only the binary is needed: `chunlian cluster` runs nginx with a generated config in a
# temporary prefix. The system nginx service is never started: a policy-rc.d that says
# "do not start services" is in place during the install (and removed after, if we made it).
set -euo pipefail

if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
  exit 0  # already installed: nothing to do
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-nginx.sh: need root (or sudo) to install nginx" >&2; exit 1
  fi
fi
echo "install-nginx.sh: installing nginx" >&2

export DEBIAN_FRONTEND=noninteractive
# policy-rc.d 101 tells invoke-rc.d not to start services during the install.
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  created_policy=1
fi
cleanup() { if [ "$created_policy" = 1 ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT

$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends nginx >/dev/null

echo "nginx installed: $(command -v nginx || echo /usr/sbin/nginx) ($(/usr/sbin/nginx -v 2>&1))"
