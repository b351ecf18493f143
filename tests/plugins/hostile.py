"""Hostile input for fuzz tests, and a timer on /healthz while it is served.

Strategies (hypothesis) for what a careless or hostile client sends: NUL
bytes and lone surrogates, odd Unicode (BOM, bidi overrides, combining
marks, noncharacters, astral planes), huge strings made of the units that
make regexes backtrack, deeply nested JSON, arbitrary JSON where an object
is expected. ``draw`` turns a strategy into a fixed, derandomized list of
cases, so an async test can send them all while ``HealthzTimer`` polls
/healthz on the same event loop: anything that blocks the loop or holds
the GIL while it is served shows up as a slow /healthz.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.plugins.asgi_client import ASGIStream

ODD = [
    "\x00",
    "\ud800",
    "\udfff",
    "\ufeff",
    "\u202e",
    "\u0301",
    "\uffff",
    "\U0010ffff",
    "\U0001f600",
    "\u200b",
    "\x1b[31m",
    "%",
    "\\",
    '"',
    "\r\n",
    "\u2028",
]
# Units whose long runs make backtracking patterns (e-mail, URL, card
# numbers) quadratic or worse.
HUGE_UNITS = ["%", "a", "@", "a.", "-", " ", "1", "%a", "x@", "1 ", "\x00", "é"]


def odd_text(max_huge: int) -> st.SearchStrategy[str]:
    """Short text of any code point (surrogates included), odd pieces, or a huge run."""
    anything = st.text(st.characters(exclude_categories=[]), max_size=40)
    pieces = st.lists(st.sampled_from(ODD) | st.text(max_size=3), max_size=12).map("".join)
    huge = st.builds(
        lambda unit, n: (unit * n)[:n],
        st.sampled_from(HUGE_UNITS) | st.text(min_size=1, max_size=3),
        st.integers(1_000, max_huge),
    )
    return st.one_of(anything, pieces, huge)


def json_values(max_huge: int) -> st.SearchStrategy[Any]:
    """Any JSON value, nested a little, with hostile strings as leaves and keys."""
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | odd_text(max_huge)
    )
    keys = st.text(st.characters(exclude_categories=[]), max_size=8) | st.sampled_from(ODD)
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
        max_leaves=12,
    )


def nested_bytes(depth: int, kind: str) -> bytes:
    """A JSON text nested ``depth`` deep, which a recursive parser cannot take."""
    opening, closing = ("[", "]") if kind == "list" else ('{"a":', "}")
    return (opening * depth + "1" + closing * depth).encode()


def dumps(body: Any) -> bytes:
    # Lone surrogates must reach the server as JSON escapes, as a client
    # that writes "\ud800" sends them: ensure_ascii does exactly that.
    return json.dumps(body, ensure_ascii=True).encode()


def draw(strategy: st.SearchStrategy, count: int) -> list[Any]:
    """``count`` examples of ``strategy``, the same on every run."""
    found: list[Any] = []

    @given(strategy)
    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def collect(example):
        found.append(example)

    collect()
    return found


class HealthzTimer:
    """Polls /healthz through the ASGI app on the running loop; keeps the worst latency."""

    def __init__(self, every: float = 0.05):
        self.every = every
        self.worst = 0.0
        self.polls = 0
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> HealthzTimer:
        self._task = asyncio.get_running_loop().create_task(self._poll())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _poll(self) -> None:
        while True:
            started = time.monotonic()
            stream = ASGIStream("GET", "/healthz", {}, b"")
            body = await stream.read_all(timeout=60)
            assert stream.status == 200, body
            self.worst = max(self.worst, time.monotonic() - started)
            self.polls += 1
            # A blocked loop also delays the wake-up: that lag counts too.
            before = time.monotonic()
            await asyncio.sleep(self.every)
            self.worst = max(self.worst, time.monotonic() - before - self.every)
