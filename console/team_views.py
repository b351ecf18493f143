"""Console pages of membership and accountability: accepting an invitation
(the one page for a signed-out visitor with a token), withdrawing one, and
the audit log. One call deep, like console.views."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console import selectors
from console.access import tenant_admin
from console.audit import audit_lines
from console.forms import InvitationAcceptForm
from console.views import form_errors
from tenants.models import Invitation, Membership
from tenants.selectors import invitation_pending_get
from tenants.services import invitation_accept, invitation_revoke, tenant_set_shadow_opt_in


@tenant_admin
@require_POST
def invitation_revoke_view(request, invitation_id: int):
    try:
        invitation_revoke(tenant=request.tenant, invitation_id=invitation_id)
    except Invitation.DoesNotExist as exc:
        raise Http404("No such invitation.") from exc
    messages.success(request, "Invitation withdrawn.")
    return redirect("console:team")


def invitation_accept_view(request, token: str):
    """An invitee creates their account: always a new one, never an existing one."""
    invitation = invitation_pending_get(token=token)
    if invitation is None:
        return render(request, "console/invitation_invalid.html", status=404)
    if request.user.is_authenticated:
        return render(request, "console/invitation_signed_in.html", status=409)
    form = InvitationAcceptForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            membership = invitation_accept(
                token=token, username=data["username"], password=data["password1"]
            )
        except Invitation.DoesNotExist:
            return render(request, "console/invitation_invalid.html", status=404)
        except ValidationError as exc:
            form_errors(form, exc, aliases={"password": "password1", "__all__": "password1"})
        else:
            login(request, membership.user, backend="django.contrib.auth.backends.ModelBackend")
            messages.success(request, f"Welcome to {membership.tenant.name}.")
            return redirect("console:chat")
    context = {"form": form, "invitation": invitation}
    return render(request, "console/invitation_accept.html", context)


@login_required
def audit(request):
    """Staff see every entry; a tenant admin sees the tenant's own."""
    membership = selectors.membership_for_user(user=request.user)
    if not request.user.is_staff and (
        membership is None or membership.role != Membership.Role.ADMIN
    ):
        raise PermissionDenied("The audit log is for tenant admins and platform staff.")
    tenant = None if request.user.is_staff else membership.tenant
    entries = list(selectors.audit_entries(tenant=tenant))
    context = {"entries": entries, "lines": audit_lines(entries), "scope": tenant}
    return render(request, "console/audit.html", context)


@tenant_admin
@require_POST
def shadow_consent(request):
    """The tenant's opt-in to shadow comparisons during rollouts."""
    enabled = request.POST.get("enabled") == "on"
    tenant_set_shadow_opt_in(tenant=request.tenant, enabled=enabled)
    messages.success(request, "Shadow comparisons " + ("allowed." if enabled else "refused."))
    return redirect("console:team")
