"""Concurrency slots are leases: renewed while their response lives, and freed
(with the quota they reserved refunded) within one lease once renewals stop,
as when the web process that owned them died."""

import time

import pytest

from tenants.ratelimit import ADMITTED, CONCURRENCY, QUOTA
from tests.tenants.ratelimit_backends import KINDS, limits, make_limiter, ticket

LEASE_MS = 600


@pytest.mark.parametrize("kind", KINDS)
def test_a_renewed_slot_outlives_its_lease(kind):
    """A response renewed every third of a lease keeps its slot for several leases."""
    limiter = make_limiter(kind, lease_ms=LEASE_MS)
    lim = limits(max_concurrent=1)
    held = ticket()
    assert limiter.admit(ticket=held, limits=lim, tokens=1, quota_seed=0).outcome == ADMITTED
    deadline = time.monotonic() + 3 * LEASE_MS / 1000
    while time.monotonic() < deadline:
        time.sleep(LEASE_MS / 3000)
        assert limiter.renew(ticket=held) is True
        assert limiter.admit(ticket=ticket(), limits=lim, tokens=1).outcome == CONCURRENCY
    assert limiter.settle(ticket=held, tokens=1, quota_tokens=1) is True
    assert limiter.renew(ticket=held) is False
    assert limiter.admit(ticket=ticket(), limits=lim, tokens=1).outcome == ADMITTED


@pytest.mark.parametrize("kind", KINDS)
def test_an_owner_that_stops_renewing_loses_the_slot_and_its_quota_hold(kind):
    """No renewal for one lease (the owner died): the slot is free again and the
    tokens its reservation took from the monthly quota come back; the dead owner
    can neither renew nor settle it afterwards."""
    limiter = make_limiter(kind, lease_ms=LEASE_MS)
    lim = limits(max_concurrent=1, monthly_quota=1000)
    dead = ticket()
    assert limiter.admit(ticket=dead, limits=lim, tokens=800, quota_seed=0).outcome == ADMITTED
    assert limiter.admit(ticket=ticket(), limits=lim, tokens=800).outcome == QUOTA
    time.sleep(LEASE_MS / 1000 + 0.05)
    assert limiter.admit(ticket=ticket(), limits=lim, tokens=800).outcome == ADMITTED
    assert limiter.quota_used(tenant_id=dead.tenant_id, period=dead.period) == 800
    assert limiter.renew(ticket=dead) is False
    assert limiter.settle(ticket=dead, tokens=800, quota_tokens=800) is False
    assert limiter.quota_used(tenant_id=dead.tenant_id, period=dead.period) == 800
