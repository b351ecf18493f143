"""Keep the request path serving while PostgreSQL is unreachable.

Three pieces, each used only when a database call has just failed:

- API keys: every successful authentication is remembered in Redis for
  ``FLEET_AUTH_CACHE_SECONDS`` (prefix -> SHA-256 of the whole key, the
  tenant and key ids, the cache salt, the tier name, the key's limits, the
  tenant's budget and its choice for when the budget cannot be checked); with
  the database down, a key is accepted if its hash matches that entry, and
  its tier's limits come from the control snapshot. A key the database
  refuses loses its entry at once, but only when the refused key is the
  cached one (same hash): a wrong secret for a known prefix must never
  tombstone the real key (anyone can see a prefix).
- Usage records that cannot be written go to the usage stream
  (``inference.services.usage_settle``), which billing's settler writes to
  UsageRecord once the database is back, idempotently on ``response_id``.
- A breaker: after a connection-level database error (``DB_UNREACHABLE``),
  the next ``DB_RETRY_SECONDS`` skip the database, so each request does not
  wait out a connection timeout. An error about one query (DataError,
  IntegrityError, ProgrammingError) says nothing about the database being
  reachable and never trips it: else one request with a NUL byte would put
  every tenant on the fallbacks for the window.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import time
from datetime import UTC, datetime
from decimal import Decimal

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError

from fleet.snapshot import snapshot_current
from tenants.models import ApiKey, Tenant, Tier, hash_api_key

logger = logging.getLogger(__name__)

DB_RETRY_SECONDS = 5.0
_AUTH_PREFIX = "fleet:auth:"
_db_down_until = 0.0
# The database errors that mean "unreachable" (connection refused, lost,
# timed out, pool exhausted), as opposed to a query the database refused.
DB_UNREACHABLE = (OperationalError, InterfaceError)


def db_marked_down() -> bool:
    return time.monotonic() < _db_down_until


def db_mark_down() -> None:
    global _db_down_until
    _db_down_until = time.monotonic() + DB_RETRY_SECONDS
    logger.warning("database unreachable; serving from the snapshot and caches")


_clients: dict[str, redis.Redis] = {}


def _redis() -> redis.Redis | None:
    url = settings.REDIS_URL
    if not url:
        return None
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(
            url, socket_timeout=1, socket_connect_timeout=1
        )
    return client


# -- API keys ----------------------------------------------------------------------


def _decimal_text(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


def auth_cache_remember(*, api_key: ApiKey) -> None:
    """Store what authenticating this key again without the database needs."""
    client = _redis()
    if client is None:
        return
    entry = {
        "secret_hash": api_key.secret_hash,
        "key_id": api_key.pk,
        "name": api_key.name,
        "rpm_limit": api_key.rpm_limit,
        "tpm_limit": api_key.tpm_limit,
        "tenant_id": api_key.tenant_id,
        "tenant_name": api_key.tenant.name,
        "expires_at": api_key.expires_at.timestamp() if api_key.expires_at else None,
        "allowed_models": list(api_key.allowed_models or []),
        "cache_salt": api_key.tenant.cache_salt,
        "tier": api_key.tenant.tier.name,
        # The budget still binds while the database is down (billing's
        # ledger holds the spend); the tenant's choice for when it cannot.
        "monthly_budget": _decimal_text(api_key.tenant.monthly_budget),
        "budget_when_redis_down": api_key.tenant.budget_when_redis_down,
    }
    try:
        if _revoked_entry(client.get(_AUTH_PREFIX + api_key.prefix), api_key.secret_hash):
            # A request that read the key just before its revocation
            # committed must not bring the cached success back.
            return
        client.set(
            _AUTH_PREFIX + api_key.prefix, json.dumps(entry), ex=settings.FLEET_AUTH_CACHE_SECONDS
        )
    except redis.RedisError:
        logger.warning("could not cache the authentication of %s", api_key.prefix)


def _revoked_entry(raw: bytes | None, secret_hash: str) -> bool:
    if raw is None:
        return False
    try:
        entry = json.loads(raw)
    except ValueError:
        return False
    return bool(entry.get("revoked")) and hmac.compare_digest(
        entry.get("secret_hash", ""), secret_hash
    )


def auth_cache_forget(*, raw_key: str) -> None:
    """The database refused this key: tombstone its entry, if it is the cached key.

    So that a revoked (or expired) key keeps its 401 with the database down
    later, instead of being served from the cache. A refused key whose hash
    differs from the cached entry's is a wrong secret for someone else's
    prefix: the entry stays, or a stranger could lock the real key out
    during an outage (auth-cache poisoning).
    """
    client = _redis()
    prefix = raw_key.strip().partition(".")[0]
    if client is None or not prefix:
        return
    refused_hash = hash_api_key(raw_key.strip())
    with contextlib.suppress(redis.RedisError, ValueError):
        raw = client.get(_AUTH_PREFIX + prefix)
        if raw is None:
            return
        entry = json.loads(raw)
        if entry.get("refused") or not hmac.compare_digest(
            entry.get("secret_hash", ""), refused_hash
        ):
            return
        client.set(
            _AUTH_PREFIX + prefix,
            json.dumps({"refused": True, "secret_hash": refused_hash}),
            ex=settings.FLEET_AUTH_CACHE_SECONDS,
        )


def auth_cache_revoke(*, api_key: ApiKey) -> None:
    """The key was revoked: tombstone its entry, so that no web process
    accepts it from the cache during a later outage (it was cached for up to
    ``FLEET_AUTH_CACHE_SECONDS`` after its last use). The entry is shared in
    Redis: one write covers every process."""
    client = _redis()
    if client is None:
        return
    tombstone = {"refused": True, "revoked": True, "secret_hash": api_key.secret_hash}
    try:
        client.set(
            _AUTH_PREFIX + api_key.prefix,
            json.dumps(tombstone),
            ex=settings.FLEET_AUTH_CACHE_SECONDS,
        )
    except redis.RedisError:
        # The TTL still ends it; a revocation must not fail on the cache.
        logger.warning("could not purge the cached authentication of %s", api_key.prefix)


def _on_api_key_revoked(sender, *, api_key: ApiKey, **kwargs) -> None:
    auth_cache_revoke(api_key=api_key)


class KeyUnverifiable(RuntimeError):
    """The database is down and no cached authentication covers this key.

    Not the same as an invalid key: a valid key that simply has not been
    seen lately must get a retryable 503, never a 401 that tells its owner
    to rotate it.
    """


def auth_cache_authenticate(*, raw_key: str) -> ApiKey | None:
    """The key as last authenticated by the database; None when it is wrong.

    None means provably wrong: malformed, or a secret that does not match
    the cached hash for its prefix. Raises KeyUnverifiable when there is
    nothing to check it against (no entry, no Redis, no snapshot). The
    returned objects are unsaved stand-ins (tier from the snapshot); the
    request path only reads them.
    """
    client = _redis()
    snapshot = snapshot_current()
    prefix, dot, secret = raw_key.strip().partition(".")
    if not dot or not secret:
        return None
    if client is None or snapshot is None:
        raise KeyUnverifiable(prefix)
    try:
        raw = client.get(_AUTH_PREFIX + prefix)
    except redis.RedisError as exc:
        raise KeyUnverifiable(prefix) from exc
    if raw is None:
        raise KeyUnverifiable(prefix)
    entry = json.loads(raw)
    if entry.get("refused"):
        return None
    if not hmac.compare_digest(hash_api_key(raw_key.strip()), entry["secret_hash"]):
        return None
    expires_at = entry.get("expires_at")
    if expires_at is not None and expires_at <= time.time():
        return None
    tier_settings = snapshot.tiers.get(entry["tier"])
    if tier_settings is None:
        raise KeyUnverifiable(prefix)
    tier = Tier(**{f: getattr(tier_settings, f) for f in tier_settings.__slots__})
    budget = entry.get("monthly_budget")
    tenant = Tenant(
        pk=entry["tenant_id"],
        name=entry["tenant_name"],
        tier=tier,
        cache_salt=entry["cache_salt"],
        monthly_budget=Decimal(budget) if budget is not None else None,
        budget_when_redis_down=entry.get(
            "budget_when_redis_down", Tenant.BudgetWhenRedisDown.REFUSE
        ),
    )
    return ApiKey(
        pk=entry["key_id"],
        name=entry["name"],
        prefix=prefix,
        secret_hash=entry["secret_hash"],
        tenant=tenant,
        rpm_limit=entry["rpm_limit"],
        tpm_limit=entry["tpm_limit"],
        expires_at=datetime.fromtimestamp(expires_at, UTC) if expires_at is not None else None,
        allowed_models=entry.get("allowed_models") or [],
    )
