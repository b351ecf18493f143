"""Safety fixtures: a clean policy cache for every test.

Replies are scripted by ``fake_worker(texts=[...])`` (tests/plugins): its
deltas are the texts given, one token each, so a test decides exactly
where a token boundary falls.
"""

from __future__ import annotations

import pytest

from safety.selectors import policy_cache_forget


@pytest.fixture(autouse=True)
def fresh_policies():
    policy_cache_forget()
    yield
    policy_cache_forget()
