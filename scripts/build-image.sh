#!/usr/bin/env bash
# Build the chunlian container image with podman, from Debian packages only (no image registry):
#
#   1. the base image localhost/chunlian-base:bookworm: mmdebstrap --variant=minbase with
#      python3, python3-venv, python3-pip and ca-certificates, then `podman import`; built once
#      and kept (CHUNLIAN_REBUILD_BASE=1 builds it again);
#   2. the CPU build of torch==2.13.0 (the pin in pyproject.toml) as a wheel file in .whl/,
#      the build context's only copy of torch: from a local wheel directory pip knows
#      (find-links), else downloaded from PyTorch's CPU index, never PyPI's CUDA build;
#   3. `podman build` of the Dockerfile (multi-stage; layers cached between builds), with the
#      host's CA bundle lent to pip as a build secret (it is not kept in the image).
#
# Usage: scripts/build-image.sh [TAG]        (default chunlian:latest; extra podman build
#        arguments in $PODMAN_BUILD_ARGS). Installs podman & co. first (install-containers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-chunlian:latest}
BASE=localhost/chunlian-base:bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_VERSION=$(sed -n 's/^ *"torch==\([0-9.]*\)".*/\1/p' pyproject.toml)
CA=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
[ -n "$TORCH_VERSION" ] || { echo "build-image.sh: no torch==X pin in pyproject.toml" >&2; exit 1; }

scripts/install-containers.sh

if [ "${CHUNLIAN_REBUILD_BASE:-0}" = 1 ] || ! podman image exists "$BASE"; then
  echo "build-image.sh: building $BASE from Debian bookworm ($MIRROR)" >&2
  tarball=$(mktemp --suffix=.tar)
  trap 'rm -f "$tarball"' EXIT
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$tarball" "$MIRROR"
  podman import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
    --message "Debian bookworm minbase + python3 (mmdebstrap)" "$tarball" "$BASE" >/dev/null
  rm -f "$tarball"
fi

mkdir -p .whl
wheel=$(ls .whl/torch-"$TORCH_VERSION"+cpu-cp311-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  # pip's own configuration says where local wheels lie (find-links: a directory)
  for dir in ${PIP_FIND_LINKS:-} $(python3 -m pip config list 2>/dev/null | sed -n "s/.*find-links='\(.*\)'/\1/p"); do
    found=$(ls "$dir"/torch-"$TORCH_VERSION"+cpu-cp311-*.whl 2>/dev/null | head -n1 || true)
    if [ -n "$found" ]; then cp "$found" .whl/; break; fi
  done
  wheel=$(ls .whl/torch-"$TORCH_VERSION"+cpu-cp311-*.whl 2>/dev/null | head -n1 || true)
fi
if [ -z "$wheel" ]; then
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
    --index-url https://download.pytorch.org/whl/cpu -d .whl "torch==$TORCH_VERSION+cpu"
  wheel=$(ls .whl/torch-"$TORCH_VERSION"+cpu-cp311-*.whl | head -n1)
fi

# shellcheck disable=SC2086 # PODMAN_BUILD_ARGS is a list of words
podman build --format docker --layers --secret id=pip_ca,src="$CA" \
  --build-arg TORCH_WHEEL="$(basename "$wheel")" ${PODMAN_BUILD_ARGS:-} -t "$TAG" -f Dockerfile .
