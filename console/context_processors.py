"""Template context for the console's navigation, on every page."""

from django.conf import settings

from tenants.models import Membership


def console(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    membership = Membership.objects.select_related("tenant__tier").filter(user=user).first()
    return {
        "console_tenant": membership.tenant if membership else None,
        "console_is_tenant_admin": bool(membership and membership.role == Membership.Role.ADMIN),
        # Every cost the console shows is in this currency (billing_format.money).
        "billing_currency": settings.BILLING_CURRENCY,
    }
