#!/bin/sh
# A private Docker daemon for tests/deploy/test_compose_up.py on a machine
# without one running (as this project's: no systemd, no Docker service):
# Debian's docker.io, the vfs storage driver (no overlayfs needed), no
# iptables rules (containers reach each other on compose's networks, and
# the host reaches published ports through docker-proxy; builds use the
# host's network). Then: DOCKER_HOST=unix://$DIR/docker.sock bin/test --slow tests/deploy/test_compose_up.py
# Stop it with: kill "$(cat "$DIR/dockerd.pid")"
set -eu
DIR="${1:-/var/tmp/llmp-dockerd}"
command -v dockerd >/dev/null 2>&1 || apt-get install -y -qq docker.io docker-compose >/dev/null
mkdir -p "$DIR"
setsid dockerd --data-root "$DIR/root" --exec-root "$DIR/exec" --pidfile "$DIR/dockerd.pid" \
  -H "unix://$DIR/docker.sock" --storage-driver vfs --iptables=false --ip-masq=false \
  >>"$DIR/dockerd.log" 2>&1 &
for _ in $(seq 60); do
  DOCKER_HOST="unix://$DIR/docker.sock" docker info >/dev/null 2>&1 && break
  sleep 1
done
DOCKER_HOST="unix://$DIR/docker.sock" docker info --format '{{.ServerVersion}} {{.Driver}}'
echo "export DOCKER_HOST=unix://$DIR/docker.sock"
