"""A transaction-scoped named lock: PostgreSQL advisory locks, nothing on SQLite."""

from django.db import connection


def lock_for_transaction(name: str) -> None:
    """Hold the lock ``name`` until the current transaction ends.

    SQLite (embedded mode) serializes writers itself, so there is nothing
    to take there.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [name])
