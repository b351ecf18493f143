"""Tenant administration: invitations, members and per-key limits.

Every function takes the acting admin's tenant and looks rows up within
it, so an id from another tenant is simply not found. Members join only by
invitation, which creates a new account: an existing account (another
tenant's user, platform staff) is never attached to a tenant from here.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import transaction
from django.template.loader import render_to_string

from tenants.models import ApiKey, Invitation, Membership, Tenant
from tenants.services import api_key_revoke, invitation_create


def _other_admins(tenant: Tenant, membership: Membership) -> bool:
    return tenant.memberships.filter(role=Membership.Role.ADMIN).exclude(pk=membership.pk).exists()


@transaction.atomic
def member_invite(
    *,
    tenant: Tenant,
    email: str,
    role: str,
    invited_by: AbstractBaseUser,
    link_for: Callable[[str], str],
) -> Invitation:
    """Create an invitation and email its link (``link_for(token)``).

    The same answer whether or not an account with that address exists:
    nothing here looks one up. Sent inside the transaction, so a mail
    failure leaves no invitation behind.
    """
    invitation, token = invitation_create(
        tenant=tenant, email=email, role=role, invited_by=invited_by
    )
    context = {"invitation": invitation, "link": link_for(token), "inviter": invited_by}
    send_mail(
        subject=f"Join {tenant.name} on the LLM platform",
        message=render_to_string("console/invitation_email.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[invitation.email],
    )
    return invitation


def _membership(tenant: Tenant, membership_id: int) -> Membership:
    """Raises Membership.DoesNotExist for another tenant's membership."""
    return tenant.memberships.select_related("user").get(pk=membership_id)


@transaction.atomic
def member_set_role(*, tenant: Tenant, membership_id: int, role: str) -> Membership:
    """Change a member's role; the tenant always keeps at least one admin."""
    membership = _membership(tenant, membership_id)
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"Unknown role {role!r}."})
    if (
        membership.role == Membership.Role.ADMIN
        and role != Membership.Role.ADMIN
        and not _other_admins(tenant, membership)
    ):
        raise ValidationError("A tenant needs at least one admin.")
    membership.role = role
    membership.full_clean()
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def member_remove(*, tenant: Tenant, membership_id: int) -> None:
    """Remove a member from the tenant and revoke their keys (the account is kept)."""
    membership = _membership(tenant, membership_id)
    if membership.role == Membership.Role.ADMIN and not _other_admins(tenant, membership):
        raise ValidationError("A tenant needs at least one admin.")
    # A removed member's keys stop working with their membership.
    for api_key in ApiKey.objects.filter(tenant=tenant, owner=membership.user, revoked_at=None):
        api_key_revoke(api_key=api_key)
    membership.delete()


@transaction.atomic
def api_key_set_limits(
    *, tenant: Tenant, api_key_id: int, rpm_limit: int | None, tpm_limit: int | None
) -> ApiKey:
    """Per-key overrides, within the tier's limits (ValidationError otherwise)."""
    api_key = ApiKey.objects.select_related("tenant__tier").get(tenant=tenant, pk=api_key_id)
    api_key.rpm_limit = rpm_limit
    api_key.tpm_limit = tpm_limit
    api_key.full_clean()
    api_key.save(update_fields=["rpm_limit", "tpm_limit"])
    return api_key
