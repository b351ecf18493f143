"""Billing pages: the GPU cost report (staff) and invoices (tenant admins), with CSV.

Views are thin: check who asks, call one selector or enqueue one task,
render. Long report runs go to Celery; their page polls the task's progress.
"""

from __future__ import annotations

import csv
from datetime import date, timedelta

from celery.result import AsyncResult
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing import tasks
from billing.selectors.invoices import invoice_get, invoice_list
from billing.selectors.reports import CSV_COLUMNS, csv_text, gpu_cost_report, gpu_cost_totals
from billing.selectors.rollups import daily_usage_list
from tenants.models import Membership, Tenant

# Longer ranges run as a Celery task with a progress page.
INLINE_REPORT_DAYS = 31
DEFAULT_REPORT_DAYS = 14


def _csv_response(filename: str, header: list[str], rows: list[list]) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    writer = csv.writer(response)
    writer.writerow(header)
    writer.writerows(rows)
    return response


def _report_range(request: HttpRequest) -> tuple[date, date]:
    today = timezone.now().date()
    try:
        end = date.fromisoformat(request.GET.get("end") or today.isoformat())
        start = date.fromisoformat(
            request.GET.get("start") or (end - timedelta(days=DEFAULT_REPORT_DAYS - 1)).isoformat()
        )
    except ValueError as exc:
        raise Http404("start and end must be dates (YYYY-MM-DD)") from exc
    if start > end:
        start, end = end, start
    return start, end


def _tenant_admin(request: HttpRequest) -> Tenant:
    membership = getattr(request.user, "membership", None)
    if membership is None or membership.role != Membership.Role.ADMIN:
        raise PermissionDenied("Invoices are for your organization's admins.")
    return membership.tenant


@login_required
def index(request: HttpRequest) -> HttpResponse:
    return redirect("billing:gpu_report" if request.user.is_staff else "billing:invoices")


@staff_member_required
def gpu_report(request: HttpRequest) -> HttpResponse:
    start, end = _report_range(request)
    days = (end - start).days + 1
    rows = gpu_cost_report(start=start, end=end) if days <= INLINE_REPORT_DAYS else None
    chart = None
    if rows is not None:
        chart = {
            "days": sorted({r.day.isoformat() for r in rows}),
            "rows": [
                {
                    "day": r.day.isoformat(),
                    "model": r.model,
                    # No GPU time sampled that day: no cost to chart, not a 0.
                    "cpm": float(r.cost_per_million_useful)
                    if r.cost_per_million_useful is not None and r.gpu_seconds
                    else None,
                    "idle": float(r.idle_share) if r.idle_share is not None else None,
                    "cost": float(r.gpu_cost),
                }
                for r in rows
            ],
        }
    return render(
        request,
        "billing/gpu_report.html",
        {
            "start": start,
            "end": end,
            "days": days,
            "rows": rows,
            "totals": gpu_cost_totals(rows) if rows else [],
            "chart": chart,
            # Why a report can be empty: no Celery beat sampling worker time
            # (plain bin/run), or workers priced at 0 per hour.
            "sampled": any(r.gpu_seconds for r in rows or ()),
            "priced": any(r.gpu_cost for r in rows or ()),
            "inline_days": INLINE_REPORT_DAYS,
            "query": f"start={start}&end={end}",
        },
    )


@staff_member_required
def gpu_report_csv(request: HttpRequest) -> HttpResponse:
    start, end = _report_range(request)
    rows = gpu_cost_report(start=start, end=end)
    return _csv_response(
        f"gpu-cost-{start}-{end}.csv",
        CSV_COLUMNS,
        [[csv_text(v) for v in r.as_dict().values()] for r in rows],
    )


@staff_member_required
@require_POST
def gpu_report_build(request: HttpRequest) -> HttpResponse:
    start, end = _report_range(request)
    result = tasks.gpu_cost_report_build.delay(start.isoformat(), end.isoformat())
    return redirect("billing:report_run", task_id=result.id)


@staff_member_required
def report_run(request: HttpRequest, task_id: str) -> HttpResponse:
    return render(request, "billing/report_run.html", {"task_id": task_id})


@staff_member_required
def report_run_status(request: HttpRequest, task_id: str) -> JsonResponse:
    """{state, done, total, csv}: PENDING until a worker takes it, PROGRESS, SUCCESS."""
    result = AsyncResult(task_id, app=tasks.gpu_cost_report_build.app)
    body = {"state": result.state, "done": 0, "total": None, "csv": None, "error": None}
    if result.state == "PROGRESS" and isinstance(result.info, dict):
        body.update(done=result.info.get("done", 0), total=result.info.get("total"))
    elif result.successful():
        body.update(done=1, total=1, csv=reverse("billing:report_run_csv", args=[task_id]))
    elif result.failed():
        body["error"] = str(result.result)
    return JsonResponse(body)


@staff_member_required
def report_run_csv(request: HttpRequest, task_id: str) -> HttpResponse:
    result = AsyncResult(task_id, app=tasks.gpu_cost_report_build.app)
    if not result.successful():
        raise Http404("The report is not ready (or has expired).")
    rows = result.result
    return _csv_response(
        f"gpu-cost-{task_id}.csv",
        CSV_COLUMNS,
        [[row.get(column, "") for column in CSV_COLUMNS] for row in rows],
    )


ROLLUP_CSV_COLUMNS = [
    "day",
    "tenant",
    "api_key",
    "model",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost",
]


@staff_member_required
def rollup_csv(request: HttpRequest) -> HttpResponse:
    """The daily roll-ups of every tenant (as of the last roll-up run)."""
    start, end = _report_range(request)
    rows = [
        [
            row.day,
            row.tenant.name,
            str(row.api_key) if row.api_key else "Console",
            row.model,
            row.requests,
            row.prompt_tokens,
            row.cached_tokens,
            row.completion_tokens,
            csv_text(row.cost),
        ]
        for row in daily_usage_list(start=start, end=end)
    ]
    return _csv_response(f"daily-usage-{start}-{end}.csv", ROLLUP_CSV_COLUMNS, rows)


@login_required
def invoices(request: HttpRequest) -> HttpResponse:
    tenant = _tenant_admin(request)
    return render(
        request,
        "billing/invoices.html",
        {"tenant": tenant, "invoices": invoice_list(tenant=tenant)},
    )


@login_required
def invoice_detail(request: HttpRequest, number: str) -> HttpResponse:
    invoice = invoice_get(tenant=_tenant_admin(request), number=number)
    if invoice is None:
        raise Http404("No such invoice.")
    return render(request, "billing/invoice_detail.html", {"invoice": invoice})


INVOICE_CSV_COLUMNS = [
    "model",
    "first_day",
    "last_day",
    "adjustment",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "prompt_per_million",
    "cached_prompt_per_million",
    "completion_per_million",
    "amount",
]


@login_required
def invoice_csv(request: HttpRequest, number: str) -> HttpResponse:
    invoice = invoice_get(tenant=_tenant_admin(request), number=number)
    if invoice is None:
        raise Http404("No such invoice.")
    rows = [[str(getattr(line, c)) for c in INVOICE_CSV_COLUMNS] for line in invoice.lines.all()]
    rows.append(["total", *[""] * (len(INVOICE_CSV_COLUMNS) - 2), str(invoice.total)])
    return _csv_response(f"{invoice.number}.csv", INVOICE_CSV_COLUMNS, rows)
