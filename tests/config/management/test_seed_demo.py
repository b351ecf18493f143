"""``manage.py seed_demo``: the newcomer's tenant, user, key and prices."""

from decimal import Decimal
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command

from billing.models import Price
from tenants.models import ApiKey, Membership
from tenants.selectors import api_key_authenticate

pytestmark = pytest.mark.django_db


def test_seed_demo_is_idempotent_and_prices_the_demo_model(tmp_path, monkeypatch):
    from config.management.commands import seed_demo

    monkeypatch.setattr(seed_demo, "KEY_FILE", tmp_path / "demo-api-key")
    out = StringIO()
    call_command("seed_demo", stdout=out, stderr=StringIO())
    raw_key = out.getvalue().strip()
    api_key = api_key_authenticate(raw_key=raw_key)
    assert api_key is not None and api_key.tenant.name == "demo"
    assert (tmp_path / "demo-api-key").read_text().strip() == raw_key
    assert Membership.objects.get(user__username="admin").role == Membership.Role.ADMIN

    pro = Price.objects.get(model=settings.DEMO_MODEL_NAME, tier__name="pro")
    assert pro.completion_per_million == Decimal("0.40")

    call_command("seed_demo", stdout=StringIO(), stderr=StringIO())
    assert ApiKey.objects.filter(tenant=api_key.tenant).count() == 1
    assert Price.objects.filter(model=settings.DEMO_MODEL_NAME).count() == 3
