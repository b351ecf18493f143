"""Joining a tenant by invitation through the console, and no enumeration.

The end-to-end flow in Chromium is tests/browser/test_invitations.py.
"""

import re

import pytest
from django.core import mail

from tenants.models import Invitation, Membership

pytestmark = pytest.mark.django_db

PASSWORD = "a-Long-enough-pass-42"


@pytest.fixture
def admin(user_factory):
    return user_factory(role="admin")


def invite(client, email: str, role: str = "member"):
    return client.post("/team/", {"email": email, "role": role}, follow=True)


def link_in(message) -> str:
    return re.search(r"https?://\S+/invitations/\S+/", message.body).group(0)


def test_an_invitation_is_emailed_and_accepted_once(client, admin, django_user_model):
    client.force_login(admin)
    invite(client, "newbie@example.com")
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["newbie@example.com"]
    path = link_in(mail.outbox[0]).split("testserver", 1)[1]
    client.logout()

    assert client.get(path).status_code == 200
    response = client.post(
        path, {"username": "newbie", "password1": PASSWORD, "password2": PASSWORD}
    )
    assert response.status_code == 302 and response["Location"] == "/chat/"
    newbie = django_user_model.objects.get(username="newbie")
    assert newbie.membership.tenant == admin.membership.tenant
    assert newbie.membership.role == Membership.Role.MEMBER
    # Signed in as the new account; the link is spent.
    assert client.get("/chat/").status_code == 200
    client.logout()
    again = client.post(path, {"username": "other", "password1": PASSWORD, "password2": PASSWORD})
    assert again.status_code == 404
    assert not django_user_model.objects.filter(username="other").exists()


def test_a_pending_invitation_is_not_sent_twice(client, admin, settings):
    """The same address (in any case) while its invitation is pending: refused,
    nothing emailed; once withdrawn it can be invited again. The sender is the
    DEFAULT_FROM_EMAIL setting."""
    settings.DEFAULT_FROM_EMAIL = "Acme AI <team@acme.example>"
    client.force_login(admin)
    invite(client, "twice@example.com")
    again = invite(client, "Twice@Example.com")
    assert again.context["invite_form"].errors["email"] == [
        "Twice@Example.com already has a pending invitation. Withdraw it to send a new one."
    ]
    pending = Invitation.objects.filter(
        tenant=admin.membership.tenant, email__iexact="twice@example.com"
    )
    assert pending.count() == 1 and len(mail.outbox) == 1
    assert mail.outbox[0].from_email == "Acme AI <team@acme.example>"
    client.post(f"/team/invitations/{pending.get().pk}/revoke/")
    invite(client, "twice@example.com")
    assert pending.count() == 2 and len(mail.outbox) == 2


def test_the_default_sender_is_no_billing_address():
    """The default the settings' source gives, not this run's override."""
    from config.settings import base

    assert "billing" not in base.DEFAULT_FROM_EMAIL


def test_inviting_says_the_same_whoever_owns_the_address(client, admin, user_factory):
    """An address of an existing account (another tenant's user) and an unknown
    one get the same answer, and neither account is touched."""
    taken = user_factory()
    taken.email = "taken@example.com"
    taken.save()
    client.force_login(admin)
    answers = []
    for email in ("taken@example.com", "nobody@example.com"):
        response = invite(client, email)
        answers.append(
            [str(m).replace(email, "EMAIL") for m in response.context["messages"]]
            + [response.status_code]
        )
    assert answers[0] == answers[1] == ["Invitation sent to EMAIL.", 200]
    assert taken.membership.tenant != admin.membership.tenant
    assert Invitation.objects.filter(tenant=admin.membership.tenant).count() == 2


def test_sign_in_failures_read_the_same_for_unknown_users(client, user_factory):
    user_factory(username="known-user", password="right-password-1")
    answers = []
    for username in ("known-user", "unknown-user"):
        response = client.post("/accounts/login/", {"username": username, "password": "wrong"})
        answers.append((response.status_code, response.context["form"].non_field_errors()))
    assert answers[0] == answers[1]


def test_a_signed_in_user_is_not_attached_by_opening_a_link(client, admin, user_factory):
    other = user_factory()
    client.force_login(admin)
    invite(client, "someone@example.com")
    path = link_in(mail.outbox[0]).split("testserver", 1)[1]
    client.force_login(other)
    assert client.get(path).status_code == 409
    response = client.post(
        path, {"username": "x-user", "password1": PASSWORD, "password2": PASSWORD}
    )
    assert response.status_code == 409
    assert other.membership.tenant != admin.membership.tenant


def test_a_member_cannot_invite(client, user_factory):
    member = user_factory(role="member")
    client.force_login(member)
    assert client.post("/team/", {"email": "a@example.com", "role": "admin"}).status_code == 403
    assert not Invitation.objects.exists()
    assert not mail.outbox
