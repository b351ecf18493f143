"""Who may see which console page.

Every page needs a signed-in user; tenant pages need an active tenant
membership (set as ``request.membership`` and ``request.tenant``), the
team pages its admin role and the fleet pages platform staff. Object
lookups are then filtered by ``request.tenant``, so another tenant's ids
are 404s.
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from console.selectors import membership_for_user
from tenants.models import Membership


def tenant_member(view):
    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        membership = membership_for_user(user=request.user)
        if membership is None:
            return render(request, "console/no_tenant.html", status=403)
        request.membership, request.tenant = membership, membership.tenant
        return view(request, *args, **kwargs)

    return wrapper


def tenant_admin(view):
    @tenant_member
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.membership.role != Membership.Role.ADMIN:
            raise PermissionDenied("Only the tenant's admins manage its team.")
        return view(request, *args, **kwargs)

    return wrapper


def platform_staff(view):
    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_staff:
            raise PermissionDenied("The fleet is for platform staff.")
        return view(request, *args, **kwargs)

    return wrapper
