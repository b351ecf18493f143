"""The console's Safety page: tenant admins choose within the tier, events are listed."""

import pytest

from safety.models import TenantSafetyPolicy
from safety.selectors import policy_for_tenant
from safety.services import safety_event_record
from tenants.models import Membership

pytestmark = pytest.mark.django_db

VALID = {
    "classifier_action": "flag",
    "classifier_threshold": "0.9",
    "pii_action": "block",
    "deny_action": "block",
    "deny_terms": "bluebird\nProject Nightingale\nbluebird",
    "output_moderation": "on",
    "store_text": "on",
}


@pytest.fixture
def admin(user_factory):
    return user_factory(role=Membership.Role.ADMIN, tier="pro")


def tenant_of(user):
    return Membership.objects.get(user=user).tenant


def test_a_member_cannot_open_it(client, user_factory):
    client.force_login(user_factory(role=Membership.Role.MEMBER))
    assert client.get("/safety/").status_code == 403


def test_an_admin_saves_choices_within_the_tier(client, admin):
    client.force_login(admin)
    response = client.post("/safety/", VALID)
    assert response.status_code == 302
    tenant = tenant_of(admin)
    row = TenantSafetyPolicy.objects.get(tenant=tenant)
    assert row.deny_terms == "bluebird\nProject Nightingale"
    policy = policy_for_tenant(tenant=tenant)
    assert (policy.classifier, policy.threshold, policy.pii) == ("flag", 0.9, "block")
    assert policy.store_text is True
    page = client.get("/safety/").content.decode()
    assert "flag at 0.9" in page and "2 terms" in page


def test_choices_beyond_the_tier_are_refused(client, user_factory):
    """The free tier requires blocking and reply moderation, and keeps no text."""
    admin = user_factory(role=Membership.Role.ADMIN, tier="free")
    client.force_login(admin)
    data = {**VALID, "output_moderation": "off"}
    response = client.post("/safety/", data)
    assert response.status_code == 400
    page = response.content.decode()
    for field in ("classifier_action", "classifier_threshold", "output_moderation", "store_text"):
        assert f'data-testid="error-{field}"' in page, field
    assert not TenantSafetyPolicy.objects.filter(tenant=tenant_of(admin)).exists()


def test_events_are_listed_for_the_tenant_only(client, admin, user_factory):
    tenant = tenant_of(admin)
    other = tenant_of(user_factory(role=Membership.Role.ADMIN))
    for owner, ref in ((tenant, "chatcmpl-mine"), (other, "chatcmpl-theirs")):
        safety_event_record(
            tenant_id=owner.pk,
            stage="output",
            outcome="blocked",
            findings=[{"check": "deny_list", "category": "bluebird", "score": 1.0}],
            text="a bluebird sang",
            store_text=False,
            request_ref=ref,
        )
    client.force_login(admin)
    page = client.get("/safety/").content.decode()
    assert "chatcmpl-mine" in page and "chatcmpl-theirs" not in page
    assert "bluebird" in page and "a bluebird sang" not in page
