"""Tenant administration: members and per-key limits.

Every function takes the acting admin's tenant and looks rows up within
it, so an id from another tenant is simply not found.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from tenants.models import ApiKey, Membership, Tenant
from tenants.services import membership_create


def _other_admins(tenant: Tenant, membership: Membership) -> bool:
    return tenant.memberships.filter(role=Membership.Role.ADMIN).exclude(pk=membership.pk).exists()


@transaction.atomic
def member_add(
    *,
    tenant: Tenant,
    identifier: str,
    role: str = Membership.Role.MEMBER,
    email: str = "",
    password: str = "",
) -> Membership:
    """Add the user named ``identifier`` (username or email), creating it if new.

    A new user needs a password. A user who already belongs to a tenant
    cannot be added: a user has exactly one tenant.
    """
    identifier = identifier.strip()
    if not identifier:
        raise ValidationError({"identifier": "Enter a username or an email address."})
    User = get_user_model()
    user = User.objects.filter(Q(username__iexact=identifier) | Q(email__iexact=identifier)).first()
    if user is None:
        if not password:
            raise ValidationError(
                {"password": "No user is called that: set a password to create the account."}
            )
        if "@" in identifier and not email:
            email = identifier
        user = User(username=identifier, email=email)
        user.set_password(password)
        user.full_clean()
        user.save()
    elif Membership.objects.filter(user=user).exists():
        raise ValidationError({"identifier": f"{user.get_username()} already belongs to a tenant."})
    return membership_create(user=user, tenant=tenant, role=role)


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
    """Remove a member from the tenant (the account itself is kept)."""
    membership = _membership(tenant, membership_id)
    if membership.role == Membership.Role.ADMIN and not _other_admins(tenant, membership):
        raise ValidationError("A tenant needs at least one admin.")
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
