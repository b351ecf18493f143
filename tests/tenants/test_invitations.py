"""Invitations: single use, expiring, always a new account."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from tenants.models import Invitation, Membership
from tenants.selectors import invitation_pending_get
from tenants.services import invitation_accept, invitation_create, invitation_revoke

pytestmark = pytest.mark.django_db

PASSWORD = "a-Long-enough-pass-42"


def test_accepting_creates_a_new_account_in_the_tenant(tenant_factory, django_user_model):
    tenant = tenant_factory()
    invitation, token = invitation_create(tenant=tenant, email="new@example.com", role="admin")
    assert invitation.token_hash != token and token not in invitation.token_hash
    membership = invitation_accept(token=token, username="newcomer", password=PASSWORD)
    assert (membership.tenant, membership.role) == (tenant, Membership.Role.ADMIN)
    user = django_user_model.objects.get(username="newcomer")
    assert user.email == "new@example.com" and user.check_password(PASSWORD)
    assert not user.is_staff
    invitation.refresh_from_db()
    assert invitation.accepted_by == user and invitation.accepted_at is not None


def test_a_token_works_once(tenant_factory):
    _, token = invitation_create(tenant=tenant_factory(), email="a@example.com")
    invitation_accept(token=token, username="first", password=PASSWORD)
    assert invitation_pending_get(token=token) is None
    with pytest.raises(Invitation.DoesNotExist):
        invitation_accept(token=token, username="second", password=PASSWORD)


def test_expired_and_withdrawn_invitations_are_refused(tenant_factory):
    tenant = tenant_factory()
    expired, expired_token = invitation_create(tenant=tenant, email="late@example.com")
    Invitation.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(1))
    withdrawn, withdrawn_token = invitation_create(tenant=tenant, email="no@example.com")
    invitation_revoke(tenant=tenant, invitation_id=withdrawn.pk)
    for token in (expired_token, withdrawn_token, "not-a-token"):
        assert invitation_pending_get(token=token) is None
        with pytest.raises(Invitation.DoesNotExist):
            invitation_accept(token=token, username=f"u{len(token)}", password=PASSWORD)


def test_an_existing_account_is_never_attached(tenant_factory, user_factory, admin_user):
    """The invitee picks a username; taking an existing one (a staff user's
    here) is refused, and that account's membership is untouched."""
    _, token = invitation_create(tenant=tenant_factory(), email=admin_user.email or "x@x.org")
    with pytest.raises(ValidationError) as refused:
        invitation_accept(token=token, username=admin_user.username, password=PASSWORD)
    assert "username" in refused.value.message_dict
    assert not Membership.objects.filter(user=admin_user).exists()
    assert invitation_pending_get(token=token) is not None


def test_weak_passwords_are_refused_by_the_validators(tenant_factory, django_user_model):
    _, token = invitation_create(tenant=tenant_factory(), email="weak@example.com")
    for weak in ("short1", "1234567890123", "password123"):
        with pytest.raises(ValidationError):
            invitation_accept(token=token, username="weakling", password=weak)
    assert not django_user_model.objects.filter(username="weakling").exists()


def test_an_invitation_cannot_be_withdrawn_through_another_tenant(tenant_factory):
    invitation, _ = invitation_create(tenant=tenant_factory(), email="a@example.com")
    with pytest.raises(Invitation.DoesNotExist):
        invitation_revoke(tenant=tenant_factory(), invitation_id=invitation.pk)
