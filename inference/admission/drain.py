"""Graceful shutdown of a web process (issue 17): drain, then stop.

On SIGTERM (``config.shutdown`` hooks it into Daphne's reactor) the process
stops taking responses: new ones get 503 ``server_draining`` with
Retry-After, so a client or load balancer retries on another process, and
``/readyz`` reports not ready. The responses it is relaying stream on to
their normal ending for up to ``WEB_DRAIN_SECONDS``; those still open then
end with an explicit ``server_shutdown`` error frame and ``[DONE]``, and
their generation is aborted. Their usage is recorded either way: by this
process from the worker's ``cancelled`` ending when it comes within
``SETTLE_GRACE_SECONDS``, else by the settler from the worker's usage entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from inference.errors import ServiceUnavailable
from inference.relay import tap as relay

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

# After the deadline: how long the ended responses get to receive their
# worker's cancelled ending and write their usage records.
SETTLE_GRACE_SECONDS = 5.0
# How long the last frames get to leave the socket before the server stops.
FLUSH_SECONDS = 0.5
# What a refused client is told to wait before retrying (on another process).
RETRY_AFTER_SECONDS = 1
_POLL_SECONDS = 0.1

_draining = False
# Requests past the draining check and not yet relaying (admission,
# dispatch): the drain waits for them too.
_admitting = 0


@dataclass(slots=True)
class DrainReport:
    """How a drain went: responses open at its start, and those cut at the deadline."""

    open_at_start: int
    shut_down: int
    seconds: float


def draining() -> bool:
    """Whether this process is shutting down (refusing new responses)."""
    return _draining


def refuse_if_draining() -> None:
    """Raise 503 ``server_draining`` while the process is shutting down."""
    if _draining:
        raise ServiceUnavailable(
            "This server is shutting down; retry the request.",
            code="server_draining",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )


@contextlib.contextmanager
def admission() -> Iterator[None]:
    """Refuse while draining; otherwise count the request until it is relayed."""
    global _admitting
    refuse_if_draining()
    _admitting += 1
    try:
        yield
    finally:
        _admitting -= 1


def admitting(start: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Decorate a service that starts a response: it runs inside ``admission``."""

    @functools.wraps(start)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with admission():
            return await start(*args, **kwargs)

    return wrapper


def _busy() -> bool:
    return _admitting > 0 or bool(relay.open_taps())


async def drain(deadline_seconds: float) -> DrainReport:
    """Refuse new responses, wait for the open ones, end the rest at the deadline."""
    global _draining
    _draining = True
    started = time.monotonic()
    open_at_start = len(relay.open_taps())
    logger.info("draining: %d responses open, deadline %ss", open_at_start, deadline_seconds)
    deadline = started + deadline_seconds
    while _busy() and time.monotonic() < deadline:
        await asyncio.sleep(_POLL_SECONDS)
    remaining = relay.open_taps()
    for tap in remaining:
        tap.shut_down()
    if remaining:
        logger.warning("drain deadline: %d responses ended server_shutdown", len(remaining))
    # Usage records of the ended ones, aborts on their way to the workers.
    await relay.drain_background(timeout=SETTLE_GRACE_SECONDS)
    await asyncio.sleep(FLUSH_SECONDS)
    return DrainReport(open_at_start, len(remaining), time.monotonic() - started)


def reset() -> None:
    """Back to serving (tests that drain in-process)."""
    global _draining
    _draining = False
