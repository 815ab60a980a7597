#!/usr/bin/env bash
# Start the local Redis the integration tests talk to, if it is not answering.
set -euo pipefail
if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then exit 0; fi
if ! command -v redis-server >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
mkdir -p /var/lib/redis /var/log/redis
redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
  --dir /var/lib/redis --logfile /var/log/redis/ci.log
for _ in $(seq 50); do redis-cli -p 6379 ping >/dev/null 2>&1 && exit 0; sleep 0.1; done
echo "redis did not start" >&2; exit 1
