"""Waiting in tests: on the condition, with a generous deadline, never on the clock.

A fixed ``sleep`` against a TTL or a background thread passes on an idle
machine and fails on a loaded one (two shared cores). These helpers poll the
condition instead: a fast machine returns at once, a slow one waits longer,
and only a condition that never comes true fails, after ``timeout``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def _fail(message: str | None, timeout: float, value: Any) -> None:
    what = message or "condition"
    pytest.fail(f"{what}: not met within {timeout}s (last value: {value!r})")


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str | None = None,
) -> T:
    """``predicate()``'s first truthy value, polled every ``interval`` s.

    Fails the test (naming ``message``) when it is still falsy after ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            _fail(message, timeout, value)
        time.sleep(interval)


async def async_wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str | None = None,
) -> T:
    """``wait_until`` for async tests: sleeps on the event loop, never blocks it.

    ``predicate`` may be a plain function or a coroutine function.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            _fail(message, timeout, value)
        await asyncio.sleep(interval)
