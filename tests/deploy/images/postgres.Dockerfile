# Test stand-in for postgres:15 (no registry but Debian's here): Debian's
# PostgreSQL 15 with the official image's interface as compose uses it
# (POSTGRES_USER/PASSWORD/DB, /var/lib/postgresql/data, pg_isready).
ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p "$PGDATA" /run/postgresql && chown -R postgres:postgres "$PGDATA" /run/postgresql \
    && chmod 700 "$PGDATA"
COPY postgres-entrypoint.sh /usr/local/bin/
USER postgres
EXPOSE 5432
ENTRYPOINT ["sh", "/usr/local/bin/postgres-entrypoint.sh"]
