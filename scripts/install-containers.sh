#!/usr/bin/env bash
# Install what the container tests need, from Debian packages, and configure podman for
# this kind of host; idempotent and quiet when everything is in place.
#
#   podman, runc, mmdebstrap    build the base image from Debian packages and run the image
#   docker-compose              `docker-compose config -q` on deploy/compose (no daemon needed)
#   uidmap, fuse-overlayfs      podman's storage and user-namespace helpers
#   netavark, aardvark-dns      the network backend whose DNS lets Compose services find each
#                               other by name (without --install-recommends apt picks the CNI
#                               plugins instead, whose networks resolve no names)
#   iptables                    netavark's firewall driver (without it every container that
#                               gets a network fails: "netavark: No such file or directory")
#
# /etc/containers/containers.conf gets the settings podman needs here (runc, cgroupfs, ulimits
# that fit this kernel's limits, the netavark network backend); an existing file with other
# content is kept aside as containers.conf.orig once. No service is started.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-containers.sh: need root (or sudo) to install podman" >&2; exit 1
  fi
fi

need=()
for pair in podman:podman runc:runc mmdebstrap:mmdebstrap docker-compose:docker-compose \
            newuidmap:uidmap fuse-overlayfs:fuse-overlayfs; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair##*:}")
done
for pkg in netavark aardvark-dns iptables; do  # by package: netavark is not on PATH, iptables only on root's
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "install-containers.sh: installing ${need[*]}" >&2
  policy=/usr/sbin/policy-rc.d
  placed=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    placed=1
  fi
  cleanup() { if [ "$placed" -eq 1 ]; then $SUDO rm -f "$policy"; fi; }
  trap cleanup EXIT
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

conf=/etc/containers/containers.conf
want='# Written by chunlian scripts/install-containers.sh: podman on this host uses runc with
# cgroupfs (no systemd here), ulimits within the kernel'"'"'s hard limits, and netavark, whose
# aardvark-dns resolves service names on Compose networks.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"
'
if [ "$(cat "$conf" 2>/dev/null || true)" != "$(printf '%s' "$want")" ]; then
  $SUDO mkdir -p /etc/containers
  if [ -s "$conf" ] && ! grep -q 'chunlian scripts/install-containers.sh' "$conf" && [ ! -e "$conf.orig" ]; then
    $SUDO cp "$conf" "$conf.orig"
  fi
  printf '%s' "$want" | $SUDO tee "$conf" >/dev/null
fi
