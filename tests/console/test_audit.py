"""The audit log: an entry for each key, member, role, tier, price, budget and
deployment change, with its actor; staff read all, tenant admins their own."""

import re
from datetime import date
from decimal import Decimal

import pytest
from auditlog.context import set_actor
from auditlog.models import LogEntry
from django.contrib.contenttypes.models import ContentType

from billing.models import BudgetPolicy, Price
from billing.services import price_set
from fleet.models import Deployment
from fleet.services import deployment_register, rollout_start
from tenants.models import ApiKey, Invitation, Membership, Tenant, Tier
from tenants.services import tenant_set_tier

pytestmark = pytest.mark.django_db


def entries(model, pk=None):
    found = LogEntry.objects.filter(content_type=ContentType.objects.get_for_model(model))
    return found.filter(object_pk=str(pk)) if pk is not None else found


def actions(model, pk) -> list[tuple[int, str | None]]:
    rows = entries(model, pk).order_by("timestamp", "pk")
    return [(e.action, e.actor.username if e.actor else None) for e in rows]


@pytest.fixture
def admin(user_factory):
    return user_factory(role="admin")


def test_console_changes_are_logged_with_their_actor(client, admin, user_factory):
    tenant = admin.membership.tenant
    colleague = user_factory(tenant=tenant)
    client.force_login(admin)

    client.post("/api-keys/", {"name": "audited", "owner": colleague.pk})
    key = ApiKey.objects.get(name="audited")
    client.post(f"/team/keys/{key.pk}/limits/", {"rpm_limit": "10", "tpm_limit": ""})
    client.post(f"/api-keys/{key.pk}/revoke/")
    client.post("/team/", {"email": "inv@example.com", "role": "member"})
    membership = colleague.membership
    client.post(f"/team/members/{membership.pk}/role/", {"role": "admin"})
    client.post(f"/team/members/{membership.pk}/remove/")

    me = admin.username
    create, update, delete = LogEntry.Action.CREATE, LogEntry.Action.UPDATE, LogEntry.Action.DELETE
    assert actions(ApiKey, key.pk) == [(create, me), (update, me), (update, me)]
    limits, revoked = entries(ApiKey, key.pk).filter(action=update).order_by("timestamp", "pk")
    assert set(limits.changes_dict) == {"rpm_limit"}
    assert set(revoked.changes_dict) == {"revoked_at"}
    invitation = Invitation.objects.get(email="inv@example.com")
    assert actions(Invitation, invitation.pk) == [(create, me)]
    assert "token_hash" not in entries(Invitation, invitation.pk).get().changes_dict
    assert actions(Membership, membership.pk)[-2:] == [(update, me), (delete, me)]
    # Secrets never reach the log.
    assert all("secret_hash" not in e.changes_dict for e in entries(ApiKey))


def test_tier_price_budget_and_deployment_changes_are_logged(admin_user, tenant_factory, tiers):
    tenant = tenant_factory(tier="pro")
    with set_actor(admin_user):
        tier = Tier.objects.get(name="pro")
        tier.rpm = 700
        tier.save()
        tenant_set_tier(tenant=tenant, tier_name="enterprise")
        tenant.monthly_budget = Decimal("100.00")
        tenant.save()
        policy = BudgetPolicy.objects.create(tenant=tenant, soft_alert_ratio=Decimal("0.5"))
        price, _ = price_set(
            model="m",
            tier=tier,
            effective_from=date(2026, 1, 1),
            prompt_per_million=Decimal("1"),
            cached_prompt_per_million=Decimal("0.5"),
            completion_per_million=Decimal("2"),
        )
        stable = deployment_register(model_name="m", version="v1")
        deployment_register(model_name="m", version="v2")
        rollout_start(model_name="m", canary_version="v2", steps=[10, 100])

    staff = admin_user.username
    tier_update = entries(Tier, tier.pk).get(action=LogEntry.Action.UPDATE)
    assert tier_update.changes_dict["rpm"] == ["600", "700"]
    assert tier_update.actor == admin_user
    tenant_changes = [e.changes_dict for e in entries(Tenant, tenant.pk).order_by("pk")]
    assert {"tier", "monthly_budget"} <= set().union(*tenant_changes)
    assert actions(BudgetPolicy, policy.pk) == [(LogEntry.Action.CREATE, staff)]
    assert actions(Price, price.pk) == [(LogEntry.Action.CREATE, staff)]
    stable_log = entries(Deployment, stable.pk)
    assert stable_log.filter(action=LogEntry.Action.CREATE).exists()
    assert any("traffic_weight" in e.changes_dict for e in stable_log)


def test_tenant_admins_see_their_tenants_entries_and_staff_see_all(
    client, admin, user_factory, admin_user, tiers
):
    other_admin = user_factory(role="admin")
    client.force_login(other_admin)
    client.post("/api-keys/", {"name": "theirs"})
    client.force_login(admin)
    client.post("/api-keys/", {"name": "ours"})
    with set_actor(admin_user):
        tier = Tier.objects.get(name="free")
        tier.rpm = 21
        tier.save()

    page = client.get("/audit/")
    assert page.status_code == 200
    shown = {(e.content_type.model, e.object_repr) for e in page.context["entries"]}
    ours = str(ApiKey.objects.get(name="ours"))
    theirs = str(ApiKey.objects.get(name="theirs"))
    assert ("apikey", ours) in shown and ("apikey", theirs) not in shown
    assert not any(model == "tier" for model, _ in shown)

    client.force_login(admin_user)
    everything = {
        (e.content_type.model, e.object_repr) for e in client.get("/audit/").context["entries"]
    }
    assert {("apikey", ours), ("apikey", theirs), ("tier", str(tier))} <= everything


def test_members_cannot_read_the_audit_log(client, user_factory):
    client.force_login(user_factory(role="member"))
    assert client.get("/audit/").status_code == 403


def test_a_tenant_admin_sets_the_shadow_opt_in_and_it_is_logged(client, admin):
    tenant = admin.membership.tenant
    client.force_login(admin)
    client.post("/team/shadow/", {"enabled": "on"})
    tenant.refresh_from_db()
    assert tenant.shadow_opt_in
    client.post("/team/shadow/", {})
    tenant.refresh_from_db()
    assert not tenant.shadow_opt_in
    changes = [e.changes_dict.get("shadow_opt_in") for e in entries(Tenant, tenant.pk)]
    assert ["False", "True"] in changes and ["True", "False"] in changes


def test_the_audit_page_reads_as_sentences_with_names(client, admin, tiers):
    """Each entry is a sentence with the actor; changes name fields and related
    rows (the tier by name, not its id), skip fields left empty and reverse
    relations (no "None → None" rows), and no time carries microseconds."""
    tenant = admin.membership.tenant
    client.force_login(admin)
    client.post("/api-keys/", {"name": "audited"})
    key = ApiKey.objects.get(name="audited")
    with set_actor(admin):
        tenant_set_tier(tenant=tenant, tier_name="enterprise")

    page = client.get("/audit/")
    lines = page.context["lines"]
    created = next(line for line in lines if line.model == "apikey")
    assert created.sentence == f"{admin.username} created the API key “{key}”"
    assert "name: audited" in created.changes
    assert not any(change.startswith(("id:", "created at:")) for change in created.changes)
    tier_change = next(
        line for line in lines if line.model == "tenant" and line.action == "changed"
    )
    old_tier = Tier.objects.get(name="pro").display_name
    new_tier = Tier.objects.get(name="enterprise").display_name
    assert tier_change.changes == [f"tier: {old_tier} → {new_tier}"]
    table = page.content.decode().split('<table id="audit">')[1]
    assert "None" not in table and "→ —" not in table
    assert not re.search(r"\d\d:\d\d:\d\d\.\d", table)


def test_the_admin_words_entries_as_the_console_does(client, admin_user, tiers):
    with set_actor(admin_user):
        tier = Tier.objects.get(name="free")
        tier.rpm = 22
        tier.save()
    client.force_login(admin_user)
    listing = client.get("/admin/auditlog/logentry/").content.decode()
    assert f"{admin_user.username} changed the tier “{tier}”" in listing
    entry = entries(Tier, tier.pk).get(action=LogEntry.Action.UPDATE)
    detail = client.get(f"/admin/auditlog/logentry/{entry.pk}/change/").content.decode()
    assert "<li>" in detail and " → 22</li>" in detail
