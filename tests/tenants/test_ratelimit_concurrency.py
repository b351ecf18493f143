"""Atomicity under load: 200 checks at once admit exactly the limit.

Threads share one limiter (both backends); for Redis, two separate
processes with their own connections race as well, as two web processes
would.
"""

import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tenants.ratelimit import ADMITTED, CONCURRENCY, REQUESTS
from tenants.ratelimit.redis_limiter import RedisLimiter
from tests.tenants.ratelimit_backends import (
    KINDS,
    limits,
    make_limiter,
    needs_redis,
    redis_test_url,
    ticket,
)

FIRED = 200
LIMIT = 37


def fire(limiter, lim, count: int, *, settle: bool = False) -> list[str]:
    """``count`` admissions released together from a barrier; their outcomes."""
    barrier = threading.Barrier(count)

    def one(_):
        t = ticket()
        barrier.wait()
        outcome = limiter.admit(ticket=t, limits=lim, tokens=10, quota_seed=0).outcome
        if settle and outcome == ADMITTED:
            limiter.settle(ticket=t, tokens=10, quota_tokens=10)
        return outcome

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.parametrize("kind", KINDS)
def test_200_concurrent_checks_admit_exactly_the_rpm(kind):
    """Exactly L of 200 simultaneous requests pass a limit of L per minute."""
    limiter = make_limiter(kind)
    outcomes = fire(limiter, limits(key_rpm=LIMIT), FIRED)
    assert outcomes.count(ADMITTED) == LIMIT
    assert outcomes.count(REQUESTS) == FIRED - LIMIT


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_cap_holds_under_a_burst_and_leaks_nothing(kind):
    """A burst never holds more than the cap, and every slot comes back."""
    limiter = make_limiter(kind)
    lim = limits(max_concurrent=5)
    held = [ticket() for _ in range(5)]
    for t in held:
        limiter.admit(ticket=t, limits=lim, tokens=1, quota_seed=0)
    outcomes = fire(limiter, lim, 50)
    assert outcomes.count(CONCURRENCY) == 50
    for t in held:
        limiter.settle(ticket=t, tokens=1, quota_tokens=1)
    outcomes = fire(limiter, lim, 50, settle=True)
    assert outcomes.count(ADMITTED) >= 5
    assert limiter.in_flight(tenant_id=1) == 0


# Each process fires its share of threads at a start time both agree on.
_PROCESS_SCRIPT = """
import sys, threading, time, uuid
from tenants.ratelimit import Ticket
from tenants.ratelimit.redis_limiter import RedisLimiter
from tests.tenants.ratelimit_backends import limits

url, prefix, count, limit, start = sys.argv[1:6]
limiter = RedisLimiter(url, prefix=prefix)
lim = limits(key_rpm=int(limit))
results = []

def one():
    t = Ticket.for_response(response_id=uuid.uuid4().hex, api_key_id=1, tenant_id=1)
    time.sleep(max(0.0, float(start) - time.time()))
    results.append(limiter.admit(ticket=t, limits=lim, tokens=1, quota_seed=0).outcome)

threads = [threading.Thread(target=one) for _ in range(int(count))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(results.count("ok"))
"""


@needs_redis
def test_two_processes_sharing_redis_admit_exactly_the_rpm():
    """Two processes, 100 threads each, one key: exactly L admitted in all."""
    prefix = f"rltest-{uuid.uuid4().hex[:12]}"
    start = time.time() + 3.0
    args = [redis_test_url(), prefix, str(FIRED // 2), str(LIMIT), str(start)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROCESS_SCRIPT, *args], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    admitted = [int(p.communicate(timeout=60)[0].strip()) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(admitted) == LIMIT
    # The shared window saw every admission, whichever process made it.
    snapshot = RedisLimiter(redis_test_url(), prefix=prefix).admit(
        ticket=ticket(), limits=limits(key_rpm=LIMIT), tokens=1, quota_seed=0
    )
    assert (snapshot.outcome, snapshot.key_requests) == (REQUESTS, LIMIT)
