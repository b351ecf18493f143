"""CPU work off the event loop, in a pool thread that keeps no connection.

``sync_to_async(..., thread_sensitive=False)`` runs a function in the
event loop's default executor, whose threads live as long as the process.
A database query there (a model registered since the last snapshot, a
tokenizer's catalog lookup) checks a connection out of the pool for that
thread, and Django gives it back only at the end of a request, in the
request's own thread: never for these. Each executor thread then held a
pooled connection for good, and with more executor threads than
DB_POOL_MAX (min(32, CPUs + 4) of them) the pool ran dry and every request
waited DB_POOL_TIMEOUT; the long test runs hit it through per-test event
loops. ``offloaded`` returns the connection when the function ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import wraps
from typing import ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

P = ParamSpec("P")
R = TypeVar("R")


def idle_connections_close() -> None:
    """What Django does at the end of a request, except inside a transaction
    (a test's, or a caller's): closing there would end it."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


def offloaded(func: Callable[P, R], *, thread_sensitive: bool = False) -> Callable[P, Awaitable[R]]:
    """``func`` as a coroutine run in a pool thread (off the event loop,
    in parallel with other requests' work), its connections closed after.

    ``thread_sensitive``: in the request's own thread instead, for writes
    that a relay task makes after its request has ended (that thread
    outlives the request, and its connection with it).
    """

    @wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        finally:
            idle_connections_close()

    return sync_to_async(run, thread_sensitive=thread_sensitive)
