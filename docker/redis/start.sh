#!/bin/sh
# The redis service's entry point: render the ACL users from the passwords
# in its environment, then start Redis with them, append-only.
set -eu
sh /etc/redis-acl/render-acl.sh /tmp/users.acl
exec docker-entrypoint.sh redis-server --aclfile /tmp/users.acl \
  --appendonly yes --appendfsync everysec --save "" "$@"
