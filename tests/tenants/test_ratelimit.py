"""The limiters' semantics, the same cases over Redis + Lua and in-process.

No Django database: the limiters are plain state machines over Redis or
memory; the monthly counter's seed is passed in as the services would.
"""

import dataclasses
import time

import pytest

from tenants.ratelimit import (
    ADMITTED,
    CONCURRENCY,
    QUOTA,
    REQUESTS,
    TOKENS,
    batch_limits,
    decision_from,
    format_reset,
)
from tenants.ratelimit.base import NEEDS_SEED, WINDOW_MS
from tests.helpers import wait_until
from tests.tenants.ratelimit_backends import KINDS, limits, make_limiter, ticket


@pytest.fixture(params=KINDS)
def limiter(request):
    return make_limiter(request.param)


def admit(limiter, t, lim, tokens=10, seed=0):
    return limiter.admit(ticket=t, limits=lim, tokens=tokens, quota_seed=seed)


def test_first_admission_of_a_month_asks_for_the_quota_seed(limiter):
    """Without a known monthly counter nothing is taken until a seed comes."""
    lim, t = limits(), ticket()
    assert limiter.admit(ticket=t, limits=lim, tokens=5).outcome == NEEDS_SEED
    assert limiter.quota_used(tenant_id=t.tenant_id, period=t.period) is None
    assert admit(limiter, t, lim, tokens=5, seed=100).outcome == ADMITTED
    assert limiter.quota_used(tenant_id=t.tenant_id, period=t.period) == 105


def test_requests_per_minute_per_key_and_per_tenant(limiter):
    """The key's rpm and the tenant's rpm both bound; a refusal takes nothing."""
    lim = limits(key_rpm=2, tenant_rpm=3)
    outcomes = [admit(limiter, ticket(api_key_id=1), lim).outcome for _ in range(3)]
    assert outcomes == [ADMITTED, ADMITTED, REQUESTS]
    # Another key of the same tenant: only the tenant's third request is left.
    assert admit(limiter, ticket(api_key_id=2), lim).outcome == ADMITTED
    assert admit(limiter, ticket(api_key_id=2), lim).outcome == REQUESTS


def test_tokens_reserved_then_settled_to_the_exact_usage(limiter):
    """prompt + max_tokens is reserved; the settlement leaves the real usage."""
    lim = limits(key_tpm=1000)
    first = ticket()
    snap = admit(limiter, first, lim, tokens=600)
    assert (snap.outcome, snap.key_tokens, snap.tenant_tokens) == (ADMITTED, 600, 600)
    assert admit(limiter, ticket(), lim, tokens=500).outcome == TOKENS
    assert limiter.settle(ticket=first, tokens=123, quota_tokens=123) is True
    snap = admit(limiter, ticket(), lim, tokens=500)
    assert (snap.outcome, snap.key_tokens, snap.tenant_tokens) == (ADMITTED, 623, 623)
    assert limiter.quota_used(tenant_id=first.tenant_id, period=first.period) == 623


def test_settling_twice_changes_nothing(limiter):
    """The settlement is idempotent per response id."""
    lim, t = limits(), ticket()
    admit(limiter, t, lim, tokens=100)
    assert limiter.settle(ticket=t, tokens=40, quota_tokens=40) is True
    assert limiter.settle(ticket=t, tokens=0, quota_tokens=0) is False
    assert limiter.quota_used(tenant_id=t.tenant_id, period=t.period) == 40
    assert admit(limiter, ticket(), lim, tokens=1).key_tokens == 41


def test_failure_before_the_first_token_is_refunded(limiter):
    """Settling to zero gives the whole reservation back to the window."""
    lim, t = limits(key_tpm=100), ticket()
    admit(limiter, t, lim, tokens=100)
    limiter.settle(ticket=t, tokens=0, quota_tokens=0)
    snap = admit(limiter, ticket(), lim, tokens=100)
    assert (snap.outcome, snap.key_tokens) == (ADMITTED, 100)


def test_concurrency_slot_is_released_by_the_settlement(limiter):
    """The tenant's cap counts responses in flight, not requests per minute."""
    lim = limits(max_concurrent=2)
    held = [ticket(), ticket()]
    for t in held:
        assert admit(limiter, t, lim).outcome == ADMITTED
    assert admit(limiter, ticket(), lim).outcome == CONCURRENCY
    assert limiter.in_flight(tenant_id=1) == 2
    limiter.settle(ticket=held[0], tokens=1, quota_tokens=1)
    assert limiter.in_flight(tenant_id=1) == 1
    assert admit(limiter, ticket(), lim).outcome == ADMITTED


@pytest.mark.parametrize("kind", KINDS)
def test_a_slot_never_settled_expires_with_its_lease(kind):
    """A web process that died mid-response leaks no slot for good: the slot is
    held for its lease, then the next request is admitted."""
    lease_ms = 1000
    limiter = make_limiter(kind, lease_ms=lease_ms)
    lim = limits(max_concurrent=1)
    leased = time.monotonic()
    assert admit(limiter, ticket(), lim).outcome == ADMITTED
    assert admit(limiter, ticket(), lim).outcome == CONCURRENCY
    # A refusal takes nothing, so asking again until admitted is harmless.
    wait_until(
        lambda: admit(limiter, ticket(), lim).outcome == ADMITTED,
        timeout=30,
        message="admission once the lease expired",
    )
    # Not before the lease ran out (50 ms for the clocks' millisecond rounding).
    assert time.monotonic() - leased >= lease_ms / 1000 - 0.05


def test_monthly_quota_refuses_with_quota_not_rate(limiter):
    """Usage + the reservation over the quota is QUOTA, checked before rates."""
    lim = limits(monthly_quota=1000, key_rpm=1)
    assert admit(limiter, ticket(), lim, tokens=100, seed=950).outcome == QUOTA
    assert admit(limiter, ticket(), lim, tokens=50).outcome == ADMITTED
    assert admit(limiter, ticket(), lim, tokens=1).outcome == QUOTA


def test_decision_headers_report_the_tightest_scope(limiter):
    """Limits, remaining and resets as OpenAI's x-ratelimit-* headers."""
    lim = limits(key_rpm=5, tenant_rpm=100, key_tpm=10_000, tenant_tpm=1000)
    decision = decision_from(admit(limiter, ticket(), lim, tokens=300), lim)
    headers = decision.headers()
    assert headers["x-ratelimit-limit-requests"] == "5"
    assert headers["x-ratelimit-remaining-requests"] == "4"
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers["x-ratelimit-remaining-tokens"] == "700"
    assert headers["x-ratelimit-reset-requests"] in ("1m0s", "59s")
    assert decision.retry_after_ms == 0


def test_refusal_retry_after_is_the_time_left_in_the_window(limiter):
    """A request refused by rpm may retry when the admission in its way leaves the
    window, not before: its retry-after is the window less that admission's age."""
    lim = limits(key_rpm=1)
    started = time.monotonic()
    admit(limiter, ticket(), lim)
    # Time passing inside the window is the behaviour under test: 50 ms at
    # least, which a slow machine can only lengthen (measured below).
    time.sleep(0.05)
    decision = decision_from(admit(limiter, ticket(), lim), lim)
    elapsed_ms = (time.monotonic() - started) * 1000
    assert decision.outcome == REQUESTS
    # Bounds from the measured time, 5 ms for the clocks' millisecond rounding.
    assert WINDOW_MS - elapsed_ms - 5 <= decision.retry_after_ms <= WINDOW_MS - 45
    assert decision.remaining_requests == 0


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (20, "20ms"),
        (1000, "1s"),
        (1001, "2s"),
        (360_000, "6m0s"),
        (3_661_000, "1h1m1s"),
    ],
)
def test_reset_durations_in_openai_format(ms, text):
    """Resets read like OpenAI's: ms below a second, then h/m/s."""
    assert format_reset(ms) == text


def test_a_request_counted_ahead_is_not_counted_again_at_admission(limiter):
    """count() takes one request (no tokens); admit() of the same ticket adds
    its tokens, and the window holds one request, not two."""
    lim = limits(key_rpm=2, tenant_rpm=10)
    t = ticket()
    counted = limiter.count(ticket=t, limits=lim)
    assert (counted.outcome, counted.key_requests, counted.key_tokens) == (ADMITTED, 1, 0)
    assert limiter.count(ticket=t, limits=lim).key_requests == 1  # idempotent
    admitted = admit(limiter, t, lim, tokens=30)
    assert (admitted.outcome, admitted.key_requests, admitted.key_tokens) == (ADMITTED, 1, 30)
    assert admit(limiter, ticket(), lim).outcome == ADMITTED
    assert admit(limiter, ticket(), lim).outcome == REQUESTS


def test_a_counted_request_refused_later_still_fills_the_window(limiter):
    """A request counted, then refused before admission (too long, blocked),
    keeps its place in the request window: its work was done."""
    lim = limits(key_rpm=2, tenant_rpm=10)
    assert limiter.count(ticket=ticket(), limits=lim).outcome == ADMITTED
    assert limiter.count(ticket=ticket(), limits=lim).outcome == ADMITTED
    refused = limiter.count(ticket=ticket(), limits=lim)
    assert refused.outcome == REQUESTS and refused.retry_ms > 0
    assert admit(limiter, ticket(), lim).outcome == REQUESTS


def batch_ticket(api_key_id: int = 1, tenant_id: int = 1):
    return dataclasses.replace(ticket(api_key_id=api_key_id, tenant_id=tenant_id), batch=True)


def test_batch_lines_skip_the_interactive_windows_and_slots_but_share_the_quota(limiter):
    """Batch lines (their limits batch_limits: the quota alone) take nothing
    from the key's and tenant's request and token windows or concurrency
    slots, and run when those are full; their tokens count in the month's
    quota, reserved and settled, and the quota refuses them."""
    lim = limits(key_rpm=2, key_tpm=100, max_concurrent=2, monthly_quota=1000)
    first = ticket()
    assert admit(limiter, first, lim, tokens=50, seed=0).outcome == ADMITTED
    lines = [batch_ticket() for _ in range(3)]
    for done, line in enumerate(lines, start=1):
        assert limiter.count(ticket=line, limits=batch_limits(lim)).outcome == ADMITTED
        snap = admit(limiter, line, batch_limits(lim), tokens=200)
        # Counted once (count, then admit), in the batch lane's window only.
        assert (snap.outcome, snap.key_requests, snap.key_tokens) == (
            ADMITTED,
            done,
            200 * done,
        )
    # Three lines of 200 tokens in flight: the interactive key's second
    # request of the minute (50 of its 100 tokens, its second slot) still fits...
    second = admit(limiter, ticket(), lim, tokens=50)
    assert (second.outcome, second.key_requests, second.key_tokens) == (ADMITTED, 2, 100)
    # ...and now rpm, tpm and concurrency are all full; batch lines still run.
    assert admit(limiter, ticket(), lim, tokens=1).outcome == REQUESTS
    assert admit(limiter, batch_ticket(), batch_limits(lim), tokens=1).outcome == ADMITTED
    assert limiter.quota_used(tenant_id=1, period=first.period) == 701
    assert limiter.renew(ticket=lines[0]) is True
    assert limiter.settle(ticket=lines[0], tokens=20, quota_tokens=20) is True
    assert limiter.settle(ticket=lines[0], tokens=20, quota_tokens=20) is False
    assert limiter.quota_used(tenant_id=1, period=first.period) == 521
    # The quota binds batch lines: 521 + 500 > 1000.
    assert admit(limiter, batch_ticket(), batch_limits(lim), tokens=500).outcome == QUOTA
