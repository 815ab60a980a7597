#!/usr/bin/env bash
# Install the headless browser the end-to-end tests drive (tests/e2e), from Debian packages.
#
#   chromium, chromium-driver  the browser (Playwright drives /usr/bin/chromium; no browser download)
#   fonts-noto-cjk             a system CJK font, so that Chinese renders in screenshots
#                              (the page itself loads no web font; it names local system fonts)
#
# Idempotent and quiet: does nothing when /usr/bin/chromium and a CJK font are already there.
set -euo pipefail

need=()
[ -x /usr/bin/chromium ] || need+=(chromium chromium-driver)
if ! fc-list :lang=zh 2>/dev/null | grep -q .; then
  need+=(fonts-noto-cjk)
fi
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-browser.sh: need root (or sudo) to install: ${need[*]}" >&2; exit 1
  fi
fi

echo "install-browser.sh: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
/usr/bin/chromium --version >&2
