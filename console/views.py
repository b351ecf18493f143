"""Console pages. Each is one call deep: check access, call a service or
selector, render. Chat streaming itself is the WebSocket consumer's."""

from __future__ import annotations

import csv
from datetime import timedelta

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.selectors import tier_share, usage_daily
from console import selectors, services
from console.access import platform_staff, tenant_admin, tenant_member
from console.capacity import capacity
from console.charts import usage_chart
from console.forms import (
    ApiKeyCreateForm,
    CapacityForm,
    InviteForm,
    KeyLimitsForm,
    MemberRoleForm,
    UsageFilterForm,
)
from console.presets import capacity_presets
from fleet.selectors import served_model_list
from tenants.models import ApiKey, Membership
from tenants.selectors import api_key_list, invitation_list_pending
from tenants.services import api_key_create, api_key_revoke


@tenant_member
def chat(request, conversation_id: int | None = None):
    conversation = None
    if conversation_id is not None:
        conversation = selectors.conversation_get(
            user=request.user, tenant=request.tenant, conversation_id=conversation_id
        )
        if conversation is None:
            raise Http404("No such conversation.")
    context = {
        "conversations": selectors.conversation_list(user=request.user, tenant=request.tenant),
        "conversation": conversation,
        "transcript": selectors.conversation_transcript(conversation=conversation)
        if conversation
        else [],
        "models": served_model_list(tier=request.tenant.tier),
    }
    return render(request, "console/chat.html", context)


@tenant_member
@require_POST
def conversation_delete(request, conversation_id: int):
    conversation = selectors.conversation_get(
        user=request.user, tenant=request.tenant, conversation_id=conversation_id
    )
    if conversation is None:
        raise Http404("No such conversation.")
    services.conversation_delete(conversation=conversation)
    messages.success(request, "Conversation deleted.")
    return redirect("console:chat")


def _key_form(request, data=None) -> ApiKeyCreateForm:
    tenant = request.tenant
    return ApiKeyCreateForm(
        data,
        members=selectors.member_users(tenant=tenant),
        model_names=[m.name for m in served_model_list(tier=tenant.tier)],
    )


@tenant_member
def api_keys(request):
    """Admins create and see every key of the tenant; members see their own."""
    is_admin = request.membership.role == Membership.Role.ADMIN
    if request.method == "POST" and not is_admin:
        raise PermissionDenied("Only the tenant's admins create keys.")
    form = _key_form(request, request.POST or None) if is_admin else None
    created = None
    if form is not None and request.method == "POST" and form.is_valid():
        try:
            api_key, raw_key = api_key_create(
                tenant=request.tenant, created_by=request.user, **_key_options(form.cleaned_data)
            )
        except ValidationError as exc:
            form_errors(form, exc)
        else:
            # Rendered, not redirected: the raw key exists only in this response.
            created = {"api_key": api_key, "raw_key": raw_key}
            form = _key_form(request)
    keys = api_key_list(tenant=request.tenant, owner=None if is_admin else request.user)
    context = {
        "form": form,
        "created": created,
        "keys": keys.select_related("created_by", "owner"),
        "api_access": request.tenant.tier.api_access,
        "is_admin": is_admin,
    }
    return render(request, "console/api_keys.html", context)


def _key_options(data: dict) -> dict:
    days = data["expires_in_days"]
    return {
        "name": data["name"],
        "owner": data["owner"],
        "expires_at": timezone.now() + timedelta(days=days) if days else None,
        "allowed_models": data["allowed_models"],
    }


@tenant_admin
@require_POST
def api_key_revoke_view(request, api_key_id: int):
    api_key = get_object_or_404(ApiKey, pk=api_key_id, tenant=request.tenant)
    api_key_revoke(api_key=api_key)
    messages.success(request, f"Revoked {api_key.prefix}…; requests with it now get a 401.")
    return redirect("console:api_keys")


def _usage_rows(request):
    days, group_by = UsageFilterForm(request.GET).values()
    end = timezone.now().date()
    start = end - timedelta(days=days - 1)
    rows = usage_daily(tenant=request.tenant, start=start, end=end, group_by=group_by)
    return start, end, group_by, rows


@tenant_member
def usage(request):
    start, end, group_by, rows = _usage_rows(request)
    context = {
        "form": UsageFilterForm(request.GET or None),
        "rows": rows,
        "start": start,
        "end": end,
        "group_by": group_by,
        "chart": {**usage_chart(rows, start=start, end=end), "currency": settings.BILLING_CURRENCY},
        "query": request.GET.urlencode(),
    }
    if request.membership.role == Membership.Role.ADMIN:
        # Admins see their part of the tier's tokens (counts only, no names).
        context["tier_share"] = tier_share(tenant=request.tenant)
    return render(request, "console/usage.html", context)


@tenant_member
def usage_csv(request):
    start, end, group_by, rows = _usage_rows(request)
    response = HttpResponse(content_type="text/csv")
    filename = f"usage-{request.tenant.slug}-{start}-{end}-by-{group_by}.csv"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    writer = csv.writer(response)
    writer.writerow(
        [
            "day",
            group_by,
            "requests",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
            "total_tokens",
            "cost",
        ]
    )
    for row in rows:
        writer.writerow(
            [
                row["day"].isoformat(),
                row["group"],
                row["requests"],
                row["prompt_tokens"],
                row["cached_tokens"],
                row["completion_tokens"],
                row["prompt_tokens"] + row["completion_tokens"],
                row["cost"],
            ]
        )
    return response


@tenant_admin
def team(request):
    tenant = request.tenant
    invite_form = InviteForm(request.POST or None)
    if request.method == "POST" and invite_form.is_valid():
        try:
            services.member_invite(
                tenant=tenant,
                invited_by=request.user,
                link_for=lambda token: request.build_absolute_uri(
                    reverse("console:invitation_accept", args=[token])
                ),
                **invite_form.cleaned_data,
            )
        except ValidationError as exc:
            form_errors(invite_form, exc)
        else:
            # The same words whoever the address belongs to: no enumeration.
            messages.success(request, f"Invitation sent to {invite_form.cleaned_data['email']}.")
            return redirect("console:team")
    context = {
        "members": selectors.member_list(tenant=tenant),
        "invite_form": invite_form,
        "invitations": invitation_list_pending(tenant=tenant),
        "invitation_ttl_hours": int(settings.INVITATION_TTL.total_seconds() // 3600),
        "shadow_retention_days": settings.SHADOW_RETENTION_DAYS,
        "roles": Membership.Role.choices,
        "keys": api_key_list(tenant=tenant, include_revoked=False).select_related("tenant__tier"),
        "tier": tenant.tier,
    }
    return render(request, "console/team.html", context)


def form_errors(form, exc: ValidationError, aliases: dict[str, str] | None = None) -> None:
    aliases = aliases or {}
    if hasattr(exc, "error_dict"):
        for field, errors in exc.message_dict.items():
            field = aliases.get(field, field)
            form.add_error(field if field in form.fields else None, errors)
    else:
        form.add_error(aliases.get("__all__"), exc.messages)


@tenant_admin
@require_POST
def member_role(request, membership_id: int):
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a role.")
        return redirect("console:team")
    try:
        services.member_set_role(
            tenant=request.tenant, membership_id=membership_id, role=form.cleaned_data["role"]
        )
    except Membership.DoesNotExist as exc:
        raise Http404("No such member.") from exc
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, "Role changed.")
    return redirect("console:team")


@tenant_admin
@require_POST
def member_remove(request, membership_id: int):
    try:
        services.member_remove(tenant=request.tenant, membership_id=membership_id)
    except Membership.DoesNotExist as exc:
        raise Http404("No such member.") from exc
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, "Member removed.")
    return redirect("console:team")


@tenant_admin
def key_limits(request, api_key_id: int):
    api_key = get_object_or_404(
        ApiKey.objects.select_related("tenant__tier"), pk=api_key_id, tenant=request.tenant
    )
    initial = {"rpm_limit": api_key.rpm_limit, "tpm_limit": api_key.tpm_limit}
    form = KeyLimitsForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.api_key_set_limits(
                tenant=request.tenant, api_key_id=api_key.pk, **form.cleaned_data
            )
        except ValidationError as exc:
            form_errors(form, exc)
        else:
            messages.success(request, f"Limits of {api_key.prefix}… saved.")
            return redirect("console:team")
    context = {"api_key": api_key, "form": form, "tier": request.tenant.tier}
    return render(request, "console/key_limits.html", context)


@platform_staff
def fleet(request):
    workers = async_to_sync(selectors.worker_list)()
    ttft = selectors.ttft_percentiles()
    rows = [
        {"info": w, "ttft": ttft.get(w.worker_id), "kv_percent": w.kv_usage * 100} for w in workers
    ]
    return render(request, "console/fleet.html", {"workers": rows})


@platform_staff
def capacity_view(request):
    presets = capacity_presets()
    preset = presets.get(request.GET.get("preset", ""), next(iter(presets.values())))
    bound = any(name in request.GET for name in CapacityForm.base_fields)
    form = CapacityForm(request.GET if bound else preset["values"])
    report = None
    if form.is_valid():
        data = form.cleaned_data
        report = capacity(
            shape=form.shape(),
            gpu_memory_gib=data["gpu_memory_gib"],
            kv_dtype_bytes=data["kv_dtype_bytes"],
            runtime_reserve_gib=data["runtime_reserve_gib"],
        )
    context = {"form": form, "report": report, "presets": presets}
    return render(request, "console/capacity.html", context)
