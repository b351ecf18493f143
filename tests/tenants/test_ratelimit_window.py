"""Sliding windows: no window of the configured length, wherever it starts,
admits more than the limit, even a burst straddling where a fixed window
would have ended.

The window is shortened to one second so the edge comes quickly; times are
the limiter's own (Redis server time, or the process clock in embedded
mode), taken from each admission's snapshot.
"""

import time

import pytest

from tenants.ratelimit import ADMITTED, REQUESTS, TOKENS, decision_from
from tests.tenants.ratelimit_backends import KINDS, limits, make_limiter, ticket

WINDOW_MS = 1000
LIMIT = 5


def most_in_any_window(times: list[int], window: int) -> int:
    """The largest number of ``times`` inside one half-open window ``[t, t + window)``."""
    times = sorted(times)
    return max(sum(1 for u in times if t <= u < t + window) for t in times)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scope", ["requests", "tokens"])
def test_a_burst_across_the_window_edge_stays_within_the_limit(kind, scope):
    """One request opens the window; the rest of the limit goes just before its end,
    then requests keep coming across the edge. A fixed window admits a second full
    limit right after the edge (2x within a few milliseconds); a sliding one admits
    each only as an earlier admission leaves the window."""
    limiter = make_limiter(kind, window_ms=WINDOW_MS)
    if scope == "requests":
        lim, tokens = limits(key_rpm=LIMIT, tenant_rpm=10 * LIMIT), 1
    else:
        lim, tokens = limits(key_tpm=LIMIT * 100, tenant_tpm=10**6), 100
    admitted: list[int] = []

    def attempt() -> str:
        snap = limiter.admit(ticket=ticket(), limits=lim, tokens=tokens, quota_seed=0)
        if snap.outcome == ADMITTED:
            admitted.append(snap.now_ms)
        return snap.outcome

    started = time.monotonic()
    assert attempt() == ADMITTED
    time.sleep(0.8 * WINDOW_MS / 1000)
    assert [attempt() for _ in range(LIMIT - 1)] == [ADMITTED] * (LIMIT - 1)
    refused = REQUESTS if scope == "requests" else TOKENS
    assert attempt() == refused
    # Keep asking every 10 ms until well past the edge of the first window.
    while time.monotonic() - started < 1.6 * WINDOW_MS / 1000:
        attempt()
        time.sleep(0.01)

    assert len(admitted) > LIMIT, "nothing was admitted after the first window"
    assert most_in_any_window(admitted, WINDOW_MS) <= LIMIT


@pytest.mark.parametrize("kind", KINDS)
def test_retry_after_is_when_the_oldest_admission_leaves_the_window(kind):
    """Refused at the limit: Retry-After counts down to the moment the oldest of the
    window's admissions leaves it, and a retry then is admitted."""
    limiter = make_limiter(kind, window_ms=WINDOW_MS)
    lim = limits(key_rpm=2)
    first = limiter.admit(ticket=ticket(), limits=lim, tokens=1, quota_seed=0)
    time.sleep(0.3)
    second = limiter.admit(ticket=ticket(), limits=lim, tokens=1, quota_seed=0)
    refused = limiter.admit(ticket=ticket(), limits=lim, tokens=1, quota_seed=0)
    assert (first.outcome, second.outcome, refused.outcome) == (ADMITTED, ADMITTED, REQUESTS)
    decision = decision_from(refused, lim)
    assert decision.retry_after_ms == first.now_ms + WINDOW_MS - refused.now_ms
    # The header's reset is when the window is empty again: after the newest.
    assert decision.reset_requests_ms == second.now_ms + WINDOW_MS - refused.now_ms
    time.sleep(decision.retry_after_ms / 1000 + 0.02)
    assert limiter.admit(ticket=ticket(), limits=lim, tokens=1).outcome == ADMITTED
