"""The console's Batches page: a tenant admin's batches (staff: everyone's).

Upload a JSONL file and start a batch with one of the tenant's API keys
(lines run with that key's models and limits), cancel it, download its
output and error files. Progress bars move live over ``/ws/batches/``
(``console.batch_consumer``); ``progress.json`` is the page's fallback. One call deep, like console.views.
"""

from __future__ import annotations

from dataclasses import asdict

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from batches.models import Batch, File
from batches.selectors import batch_list_all, batch_progress
from batches.services.batches import batch_cancel, batch_create
from batches.services.files import file_open, file_upload
from console.selectors import membership_for_user
from inference.errors import APIError
from tenants.models import ApiKey, Membership, Tenant
from tenants.selectors import api_key_list


class BatchForm(forms.Form):
    file = forms.FileField(label="Requests (JSONL)")
    endpoint = forms.ChoiceField(label="Endpoint", choices=Batch.Endpoint.choices)
    api_key = forms.ModelChoiceField(
        label="Run with API key", queryset=ApiKey.objects.none(), empty_label=None
    )

    def __init__(self, *args, tenant: Tenant, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["api_key"].queryset = api_key_list(tenant=tenant, include_revoked=False)


def _scope(request) -> Tenant | None:
    """The tenant whose batches the user sees; None: every tenant's (staff)."""
    if request.user.is_staff:
        return None
    membership = membership_for_user(user=request.user)
    if membership is None or membership.role != Membership.Role.ADMIN:
        raise PermissionDenied("Only the tenant's admins see its batches.")
    return membership.tenant


def _admin_tenant(request) -> Tenant | None:
    membership = membership_for_user(user=request.user)
    if membership is not None and membership.role == Membership.Role.ADMIN:
        return membership.tenant
    return None


def _batch_for(request, batch_id: str) -> Batch:
    tenant = _scope(request)
    batches = Batch.objects.all() if tenant is None else Batch.objects.filter(tenant=tenant)
    batch = batches.filter(pk=batch_id).first()
    if batch is None:
        raise Http404("No such batch.")
    return batch


@login_required
def batches(request):
    scope = _scope(request)
    tenant = _admin_tenant(request)
    form = BatchForm(request.POST or None, request.FILES or None, tenant=tenant) if tenant else None
    if request.method == "POST" and form is not None and form.is_valid():
        upload = form.cleaned_data["file"]
        try:
            file = file_upload(
                tenant=tenant,
                purpose=File.Purpose.BATCH,
                filename=upload.name,
                content=upload,
                size=upload.size,
            )
            batch = batch_create(
                api_key=form.cleaned_data["api_key"],
                input_file_id=file.pk,
                endpoint=form.cleaned_data["endpoint"],
                completion_window="24h",
            )
        except APIError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"Batch {batch.pk} created: its lines are being checked.")
            return redirect("console:batches")
    rows = batch_list_all(tenant=scope)
    return render(
        request,
        "console/batches.html",
        {"batches": rows, "form": form, "all_tenants": scope is None, "tenant": tenant},
    )


@login_required
def batches_progress(request):
    """Status and counts of the page's batches (the socket's fallback)."""
    rows = batch_progress(tenant=_scope(request))
    return JsonResponse({"batches": [asdict(row) for row in rows]})


@login_required
@require_POST
def batch_cancel_view(request, batch_id: str):
    batch = _batch_for(request, batch_id)
    try:
        batch_cancel(tenant=batch.tenant, batch_id=batch.pk)
    except APIError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Batch {batch.pk} is being cancelled.")
    return redirect("console:batches")


@login_required
def batch_file(request, batch_id: str, kind: str):
    """A batch's output or error file, as a download."""
    batch = _batch_for(request, batch_id)
    file = {"output": batch.output_file, "errors": batch.error_file}.get(kind)
    if file is None:
        raise Http404("No such file.")
    return FileResponse(file_open(file=file), as_attachment=True, filename=file.filename)
