"""The budget ledger's holds: atomic under a burst, leased, settled once; and the
request path's reservation while Redis or PostgreSQL is down.

The same cases run over the Redis ledger (Lua) and the in-process one.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from decimal import Decimal

import pytest

import billing.ledger
from billing.ledger import EXHAUSTED, NEEDS_SEED, RESERVED
from billing.ledger.memory_ledger import MemoryLedger
from billing.ledger.redis_ledger import RedisLedger
from billing.services import BudgetExhausted, BudgetUnavailable, budget_reserve, budget_settle
from tenants.models import Tenant
from tests.billing.conftest import MODEL
from tests.tenants.ratelimit_backends import KINDS, redis_test_url

LEASE_MS = 500


def make_ledger(kind: str, lease_ms: int = 30_000):
    if kind == "memory":
        return MemoryLedger(lease_ms=lease_ms)
    return RedisLedger(
        redis_test_url(), prefix=f"bltest-{uuid.uuid4().hex[:12]}", lease_ms=lease_ms
    )


@pytest.mark.parametrize("kind", KINDS)
def test_100_simultaneous_holds_against_a_budget_of_10_take_exactly_10(kind):
    """Released together from a barrier, 100 reservations of 5 against a budget of 50
    (nothing spent yet): exactly 10 are held, and the held total is the budget."""
    book = make_ledger(kind)
    barrier = threading.Barrier(100)

    def one(i: int) -> str:
        barrier.wait()
        return book.reserve(account="a", hold_id=f"h{i}", amount=5, budget=50, seed=0).outcome

    with ThreadPoolExecutor(max_workers=100) as pool:
        outcomes = list(pool.map(one, range(100)))
    assert outcomes.count(RESERVED) == 10 and outcomes.count(EXHAUSTED) == 90
    state = book.reserve(account="a", hold_id="late", amount=0, budget=50)
    assert (state.outcome, state.spent, state.held) == (EXHAUSTED, 0, 50)


@pytest.mark.parametrize("kind", KINDS)
def test_a_hold_settles_once_into_spend_at_the_actual_cost(kind):
    """Settling moves the hold to the spend at the actual cost; a second settlement
    (a replay) changes nothing; the month starts from the seed the records give."""
    book = make_ledger(kind)
    assert book.reserve(account="a", hold_id="h", amount=5, budget=50).outcome == NEEDS_SEED
    assert book.reserve(account="a", hold_id="h", amount=5, budget=50, seed=7).outcome == RESERVED
    assert book.settle(account="a", hold_id="h", cost=3) is True
    assert book.settle(account="a", hold_id="h", cost=3) is False
    assert book.spent(account="a") == 10
    state = book.reserve(account="a", hold_id="next", amount=40, budget=50)
    assert (state.outcome, state.spent, state.held) == (RESERVED, 10, 40)


@pytest.mark.parametrize("kind", KINDS)
def test_a_hold_lives_while_renewed_and_expires_when_its_owner_stops(kind):
    """Renewed every third of a lease, a hold outlasts several leases; unrenewed (the
    web process died) it frees the budget after one lease and cannot be settled."""
    book = make_ledger(kind, lease_ms=LEASE_MS)
    assert book.reserve(account="a", hold_id="h", amount=50, budget=50, seed=0).outcome == RESERVED
    for _ in range(6):
        time.sleep(LEASE_MS / 3000)
        assert book.renew(account="a", hold_id="h") is True
        assert book.reserve(account="a", hold_id="x", amount=1, budget=50).outcome == EXHAUSTED
    time.sleep(LEASE_MS / 1000 + 0.05)
    assert book.renew(account="a", hold_id="h") is False
    assert book.reserve(account="a", hold_id="y", amount=50, budget=50).outcome == RESERVED
    assert book.settle(account="a", hold_id="h", cost=50) is False
    assert book.spent(account="a") == 0


@pytest.fixture(params=KINDS)
def ledger(request, monkeypatch):
    book = make_ledger(request.param)
    monkeypatch.setattr(billing.ledger, "get_ledger", lambda: book)
    return book


@pytest.fixture
def budget_tenant(tenant_factory, price_factory):
    """Budget 1.00; a completion token costs 0.10, prompts are free."""
    tenant = tenant_factory(tier="pro")
    tenant.monthly_budget = Decimal("1.00")
    tenant.save()
    price_factory("pro", date(2020, 1, 1), "0", "0", "100000")
    return tenant


def reserve(tenant, completion: int, *, use_database: bool = True):
    return asyncio.run(
        budget_reserve(
            tenant=tenant,
            tier_id=tenant.tier_id if use_database else None,
            model=MODEL,
            hold_id=f"chatcmpl-{uuid.uuid4().hex}",
            prompt_tokens=10,
            completion_tokens=completion,
            use_database=use_database,
        )
    )


def settle(hold, completion: int, status: str = "completed") -> bool:
    return asyncio.run(
        budget_settle(
            hold=hold,
            status=status,
            prompt_tokens=10,
            cached_tokens=0,
            completion_tokens=completion,
        )
    )


@pytest.mark.django_db(transaction=True)
def test_failed_responses_release_their_hold_and_cost_nothing(ledger, budget_tenant):
    """A failed response is not billed: its hold comes back whole."""
    held = reserve(budget_tenant, 10)  # all of the budget
    with pytest.raises(BudgetExhausted):
        reserve(budget_tenant, 1)
    assert settle(held, 4, status="failed") is True
    assert ledger.spent(account=held.account) == 0
    settle(reserve(budget_tenant, 10), 4)
    assert ledger.spent(account=held.account) == 400_000_000  # 0.40


@pytest.mark.django_db(transaction=True)
def test_without_postgresql_the_budget_still_binds(ledger, budget_tenant):
    """PostgreSQL down: the budget comes from the auth cache's stand-in tenant and the
    price from the ledger's memory of the last admission; the hard stop holds."""
    settle(reserve(budget_tenant, 5), 5)  # 0.50 spent, price remembered
    stand_in = Tenant(
        pk=budget_tenant.pk,
        cache_salt=budget_tenant.cache_salt,
        monthly_budget=Decimal("1.00"),
    )
    held = reserve(stand_in, 5, use_database=False)
    assert held.amount == 500_000_000 and held.price_id is not None
    with pytest.raises(BudgetExhausted):
        reserve(stand_in, 1, use_database=False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("choice", list(Tenant.BudgetWhenRedisDown))
@pytest.mark.parametrize("outage", ["redis", "postgresql"])
def test_an_unverifiable_budget_follows_the_tenants_choice(
    ledger, budget_tenant, monkeypatch, choice, outage
):
    """Nothing to check the budget against (Redis unreachable; or PostgreSQL down and
    the ledger has not seen the month): refused by default, served unheld on "allow"."""
    budget_tenant.budget_when_redis_down = choice
    budget_tenant.save()
    if outage == "redis":
        unreachable = RedisLedger("redis://127.0.0.1:1/0")
        monkeypatch.setattr(billing.ledger, "get_ledger", lambda: unreachable)
        tenant, use_database = budget_tenant, True
    else:
        tenant = Tenant(
            pk=budget_tenant.pk,
            cache_salt=budget_tenant.cache_salt,
            monthly_budget=Decimal("1.00"),
            budget_when_redis_down=choice,
        )
        use_database = False
    if choice == Tenant.BudgetWhenRedisDown.REFUSE:
        with pytest.raises(BudgetUnavailable):
            reserve(tenant, 1, use_database=use_database)
    else:
        assert reserve(tenant, 1, use_database=use_database).account is None
