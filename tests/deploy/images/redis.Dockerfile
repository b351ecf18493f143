# Test stand-in for redis:7.2: Debian's Redis 7.0 (ACL selectors need 7.0)
# with the official image's docker-entrypoint.sh, which docker/redis/start.sh
# execs; like the official one it turns protected mode off for a
# redis-server run without a config file (the ACL file guards the server).
ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data \
    && printf '#!/bin/sh\n[ "$1" = redis-server ] && set -- "$@" --protected-mode no\nexec "$@"\n' \
        >/usr/local/bin/docker-entrypoint.sh \
    && chmod +x /usr/local/bin/docker-entrypoint.sh
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server"]
