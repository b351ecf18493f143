"""Template context for the console's navigation, on every page."""

import functools

from django.conf import settings
from django.contrib.staticfiles import finders

from tenants.models import Membership


@functools.cache
def _chartjs_installed() -> bool:
    # bin/setup copies Chart.js from npm when npm is there; without it the
    # chart pages skip the script (no 404) and say why instead.
    return finders.find("vendor/chart.umd.js") is not None


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
        "chartjs_installed": _chartjs_installed(),
    }
