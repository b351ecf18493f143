"""Which Redis the tests use, and whether it answers."""

import os

import redis


def redis_test_url(default: str) -> str:
    """REDIS_URL when set (bin/test sets it), else the module's own database."""
    return os.environ.get("REDIS_URL") or default


def redis_up(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False
