"""manage.py create_api_key."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tenants.models import ApiKey, Tenant
from tenants.selectors import api_key_authenticate

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("create_api_key", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_creates_the_tenant_and_prints_only_a_working_key(tiers):
    """stdout holds exactly the raw key, and that key authenticates."""
    out, err = run("--tenant", "Initech", "--tier", "pro", "--name", "ci")
    assert out.count("\n") == 1
    raw = out.strip().splitlines()[-1]
    api_key = api_key_authenticate(raw_key=raw)
    assert api_key is not None
    assert (api_key.name, api_key.tenant.name, api_key.tenant.tier.name) == ("ci", "Initech", "pro")
    assert raw not in err


def test_reuses_an_existing_tenant(tiers):
    """A second run adds a key to the same tenant instead of a new tenant."""
    first = run("--tenant", "Umbrella", "--tier", "enterprise")[0].strip()
    second = run("--tenant", "Umbrella", "--tier", "enterprise")[0].strip()
    assert first != second
    assert Tenant.objects.filter(name="Umbrella").count() == 1
    assert ApiKey.objects.filter(tenant__name="Umbrella").count() == 2
    assert api_key_authenticate(raw_key=first).tenant_id == (
        api_key_authenticate(raw_key=second).tenant_id
    )


def test_a_tier_mismatch_is_an_error_unless_set_tier(tiers):
    """An existing tenant is moved to another tier only with --set-tier."""
    run("--tenant", "Hooli", "--tier", "free")
    with pytest.raises(CommandError, match="--set-tier"):
        run("--tenant", "Hooli", "--tier", "pro")
    assert ApiKey.objects.filter(tenant__name="Hooli").count() == 1
    out, _ = run("--tenant", "Hooli", "--tier", "pro", "--set-tier")
    assert api_key_authenticate(raw_key=out.strip()).tenant.tier.name == "pro"


def test_an_unknown_tier_is_an_error(tiers):
    """The error names the known tiers and nothing is created."""
    with pytest.raises(CommandError, match="free"):
        run("--tenant", "Nobody", "--tier", "gold")
    assert not Tenant.objects.filter(name="Nobody").exists()
