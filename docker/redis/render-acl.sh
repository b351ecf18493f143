#!/bin/sh
# Render users.acl.template into $1 with the SHA-256 of REDIS_WEB_PASSWORD
# and REDIS_WORKER_PASSWORD (the rendered file holds no password); comments
# are dropped, Redis reads none. Used by the redis container (start.sh) and
# by the tests that run a private Redis (tests/deploy/redis_acl.py).
set -eu
: "${REDIS_WEB_PASSWORD:?set REDIS_WEB_PASSWORD}"
: "${REDIS_WORKER_PASSWORD:?set REDIS_WORKER_PASSWORD}"
sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
web=$(sha "$REDIS_WEB_PASSWORD")
worker=$(sha "$REDIS_WORKER_PASSWORD")
sed -e "/^#/d" -e "s/@WEB_PASSWORD_SHA256@/$web/" -e "s/@WORKER_PASSWORD_SHA256@/$worker/" \
  "$(dirname "$0")/users.acl.template" >"$1"
chmod 0644 "$1"
