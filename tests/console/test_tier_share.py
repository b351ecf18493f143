"""The usage page's tier-share panel: a tenant admin's part of the tier's
generated tokens over the last hour, from the usage records, without any
other tenant's name."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.selectors import tier_share
from tests.plugins.request_path import DEMO
from tests.usage_records import record_usage

pytestmark = pytest.mark.django_db


def generated(tenant, completion: int, *, ago: timedelta = timedelta(minutes=5)):
    record_usage(
        response_id=f"chatcmpl-{uuid.uuid4().hex}",
        tenant_id=tenant.pk,
        model=DEMO,
        source="api",
        prompt_tokens=10,
        completion_tokens=completion,
        created_at=timezone.now() - ago,
    )


def test_the_share_counts_the_tiers_last_hour_only(tenant_factory):
    mine, rival, quiet = (tenant_factory(tier="pro") for _ in range(3))
    generated(mine, 30)
    generated(rival, 60)
    generated(rival, 500, ago=timedelta(hours=2))  # outside the window
    generated(quiet, 0)  # no tokens generated: not contending
    generated(tenant_factory(tier="enterprise"), 900)  # another tier
    share = tier_share(tenant=mine)
    assert (share.tenant_tokens, share.tier_tokens, share.active_tenants) == (30, 90, 2)
    assert share.share == pytest.approx(1 / 3) and share.fair_share == 0.5
    assert share.contended


def test_a_tenant_admin_sees_the_panel_without_other_tenants_names(
    client, user_factory, tenant_factory
):
    admin = user_factory(role="admin")
    tenant = admin.membership.tenant
    rival = tenant_factory(name=f"Rival {uuid.uuid4().hex[:6]}", tier="pro")
    generated(tenant, 25)
    generated(rival, 75)
    client.force_login(admin)
    page = client.get("/usage/")
    body = page.content.decode()
    assert page.status_code == 200 and 'data-testid="tier-share"' in body
    assert page.context["tier_share"].tier_tokens == 100
    assert 'data-testid="tier-share-percent">25%' in body
    assert "1 other organization" in body and "equal split would be 50%" in body
    assert rival.name not in body


def test_a_member_sees_no_tier_share(client, user_factory):
    member = user_factory(role="member")
    generated(member.membership.tenant, 10)
    client.force_login(member)
    page = client.get("/usage/")
    assert page.status_code == 200
    assert (
        "tier_share" not in page.context and 'data-testid="tier-share"' not in page.content.decode()
    )
