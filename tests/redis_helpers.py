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


def celery_test_url() -> str:
    """The Celery broker and result store of every test that runs a worker.

    One for the whole process: Celery caches its producer pool and result
    backend on first use, so a second broker URL later would be ignored.
    """
    return os.environ.get("CELERY_TEST_BROKER_URL") or redis_test_url("redis://127.0.0.1:6379/7")
