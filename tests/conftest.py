"""Shared fixtures: seeded tiers and factories for tenants, keys and users.

Transactional tests (``transactional_db``) end with a flush of every table,
which deletes the tiers that the data migration seeded; with ``--reuse-db``
that empty state would even carry over to the next run. So the session
setup and the ``tiers`` fixture both restore the default tiers (idempotent,
existing rows untouched), and every factory depends on ``tiers``.
"""

import uuid
from collections.abc import Callable

import pytest

from tenants.models import ApiKey, Membership, Tenant, Tier
from tenants.services import (
    api_key_create,
    membership_create,
    tenant_create,
    tier_seed_defaults,
)

# Fixtures more than one test package uses (tests/plugins/): registered
# here, the root conftest, so that no conftest imports another's.
pytest_plugins = [
    "tests.plugins.request_path",
    "tests.plugins.fake_worker",
    "tests.plugins.engine",
    "tests.plugins.topology",
]


def _unique(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        tier_seed_defaults()


@pytest.fixture
def tiers(db) -> dict[str, Tier]:
    """The default tiers by name: ``tiers["free"]``, ``["pro"]``, ``["enterprise"]``."""
    tier_seed_defaults()
    return {tier.name: tier for tier in Tier.objects.all()}


@pytest.fixture
def tenant_factory(tiers) -> Callable[..., Tenant]:
    """``tenant_factory(name=None, tier="pro") -> Tenant`` (unique name by default)."""

    def make(name: str | None = None, tier: str = "pro") -> Tenant:
        return tenant_create(name=name or _unique("tenant"), tier_name=tier)

    return make


@pytest.fixture
def api_key_factory(tenant_factory) -> Callable[..., tuple[ApiKey, str]]:
    """``api_key_factory(tenant=None, tier="pro", **kw) -> (ApiKey, raw_key)``.

    Without a tenant, a new one on ``tier`` is created. Extra keyword
    arguments (name, rpm_limit, tpm_limit, created_by) go to api_key_create.
    """

    def make(tenant: Tenant | None = None, tier: str = "pro", **kwargs) -> tuple[ApiKey, str]:
        kwargs.setdefault("name", _unique("key"))
        return api_key_create(tenant=tenant or tenant_factory(tier=tier), **kwargs)

    return make


@pytest.fixture
def user_factory(tenant_factory, django_user_model) -> Callable[..., object]:
    """``user_factory(tenant=None, role="member", tier="pro", password="pw") -> User``.

    The user is a member of ``tenant`` (a new tenant on ``tier`` when None)
    and can log in with ``password``.
    """

    def make(
        tenant: Tenant | None = None,
        role: str = Membership.Role.MEMBER,
        tier: str = "pro",
        password: str = "pw",
        username: str | None = None,
    ):
        user = django_user_model.objects.create_user(
            username=username or _unique("user"), password=password
        )
        membership_create(user=user, tenant=tenant or tenant_factory(tier=tier), role=role)
        return user

    return make
