#!/usr/bin/env bash
# Build local images for the third-party services of deploy/compose (Redis, nginx, Prometheus)
# from Debian bookworm packages, for a host with no image registry (the images compose.yaml
# names by default come from Docker Hub). Each is mmdebstrap --variant=minbase with the
# package, then `podman import` with the entrypoint and working directory the Hub image has,
# so compose.yaml runs it unchanged:
#
#   localhost/chunlian-compose-redis:bookworm        redis-server, redis-tools
#   localhost/chunlian-compose-nginx:bookworm        nginx (Debian's build)
#   localhost/chunlian-compose-prometheus:bookworm   prometheus (ENTRYPOINT /usr/bin/prometheus)
#
# Grafana is not packaged by Debian: it has no stand-in, and a Compose run on such a host
# leaves the grafana service out. Use them with:
#   export REDIS_IMAGE=localhost/chunlian-compose-redis:bookworm \
#          NGINX_IMAGE=localhost/chunlian-compose-nginx:bookworm \
#          PROMETHEUS_IMAGE=localhost/chunlian-compose-prometheus:bookworm
# Built once and kept (CHUNLIAN_REBUILD_BASE=1 builds them again). Installs podman & co. first.
set -euo pipefail
cd "$(dirname "$0")/.."
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

scripts/install-containers.sh

build() {  # build NAME PACKAGES DIRS [podman import --change ...]; DIRS: made in the image
  local name=$1 packages=$2 dirs=$3
  shift 3
  local image=localhost/chunlian-compose-$name:bookworm
  if [ "${CHUNLIAN_REBUILD_BASE:-0}" != 1 ] && podman image exists "$image"; then
    return 0
  fi
  echo "build-compose-images.sh: building $image from Debian bookworm ($packages)" >&2
  local tarball
  tarball=$(mktemp --suffix=.tar)
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/usr/share/doc/*' \
    --customize-hook="for d in $dirs; do mkdir -p \"\$1\$d\"; done" \
    bookworm "$tarball" "$MIRROR"
  podman import --change 'ENV LANG=C.UTF-8' "$@" \
    --message "Debian bookworm minbase + $packages (mmdebstrap), a stand-in for deploy/compose" \
    "$tarball" "$image" >/dev/null
  rm -f "$tarball"
}

build redis redis-server,redis-tools /data --change 'WORKDIR /data' --change 'CMD ["redis-server"]'
build nginx nginx '' --change 'CMD ["nginx", "-g", "daemon off;"]' --change 'STOPSIGNAL SIGQUIT'
build prometheus prometheus /prometheus --change 'WORKDIR /prometheus' \
  --change 'ENTRYPOINT ["/usr/bin/prometheus"]' \
  --change 'CMD ["--config.file=/etc/prometheus/prometheus.yml"]'
