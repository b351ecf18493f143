"""``manage.py bootstrap``: the first tenant, its admin and an API key, idempotently."""

from __future__ import annotations

import io
import stat

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from tenants.models import ApiKey, Membership, Tenant
from tenants.selectors import api_key_authenticate

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery-9"


@pytest.fixture
def env(monkeypatch, tmp_path):
    values = {
        "BOOTSTRAP_TENANT": "Acme Research",
        "BOOTSTRAP_TIER": "enterprise",
        "BOOTSTRAP_ADMIN_USER": "ops",
        "BOOTSTRAP_ADMIN_EMAIL": "ops@acme.test",
        "BOOTSTRAP_ADMIN_PASSWORD": PASSWORD,
        "BOOTSTRAP_API_KEY_FILE": str(tmp_path / "keys" / "api-key"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def run(**options) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("bootstrap", stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def test_creates_tenant_admin_and_a_working_key_once(env, tmp_path, monkeypatch):
    run()
    tenant = Tenant.objects.get(name="Acme Research")
    assert tenant.tier.name == "enterprise"
    user = get_user_model().objects.get(username="ops")
    assert user.is_superuser and user.is_staff and user.check_password(PASSWORD)
    assert user.email == "ops@acme.test"
    assert Membership.objects.get(user=user, tenant=tenant).role == Membership.Role.ADMIN
    key_file = tmp_path / "keys" / "api-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = api_key_authenticate(raw_key=key_file.read_text().strip())
    assert key is not None and key.tenant_id == tenant.pk

    # Again, even with another password in the environment: nothing changes.
    monkeypatch.setenv("BOOTSTRAP_ADMIN_PASSWORD", "another-password-77")
    _, err = run()
    assert "exists" in err
    assert Tenant.objects.filter(name="Acme Research").count() == 1
    assert ApiKey.objects.filter(tenant=tenant).count() == 1
    user.refresh_from_db()
    assert user.check_password(PASSWORD)
    assert api_key_authenticate(raw_key=key_file.read_text().strip()) is not None

    run(new_key=True)
    assert ApiKey.objects.filter(tenant=tenant).count() == 2


def test_without_a_key_file_the_key_is_printed_once(env, monkeypatch):
    monkeypatch.delenv("BOOTSTRAP_API_KEY_FILE")
    out, err = run()
    assert api_key_authenticate(raw_key=out.strip()) is not None
    assert "shown once" in err
    out, _ = run()
    assert out == ""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"BOOTSTRAP_TENANT": ""}, "Set BOOTSTRAP_TENANT"),
        ({"BOOTSTRAP_ADMIN_EMAIL": ""}, "Set BOOTSTRAP_ADMIN_EMAIL"),
        ({"BOOTSTRAP_TIER": "platinum"}, "No tier 'platinum'"),
        ({"BOOTSTRAP_ADMIN_PASSWORD": ""}, "Set BOOTSTRAP_ADMIN_PASSWORD"),
        (
            {"BOOTSTRAP_ADMIN_PASSWORD": "12345"},
            "BOOTSTRAP_ADMIN_PASSWORD: This password is too short",
        ),
    ],
)
def test_bad_input_is_refused_and_leaves_nothing(env, monkeypatch, change, message):
    for name, value in change.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(CommandError, match=message):
        run()
    assert not Tenant.objects.filter(name="Acme Research").exists()
    assert not get_user_model().objects.filter(username="ops").exists()
