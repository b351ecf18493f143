"""Billing pages: the staff GPU report (HTML, chart data, CSV, background run) and invoices."""

from __future__ import annotations

import csv
import io
import json
import re
import time
from datetime import UTC, date, datetime

import pytest
from django.urls import reverse

from billing.services import daily_usage_rollup, gpu_usage_sample, invoice_issue
from wire.workers import WorkerInfo, WorkerState

pytestmark = pytest.mark.django_db
DAY = date(2025, 6, 1)


@pytest.fixture
def staff(client, django_user_model):
    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    client.force_login(user)
    return client


def sample(model: str, *, busy: float, idle: float, hourly_price: str) -> None:
    """One GPU usage sample of a worker of ``model`` on DAY."""
    worker = WorkerInfo(
        worker_id=f"w-{model}",
        model=model,
        state=WorkerState.READY,
        extra={
            "boot_id": "b",
            "busy_seconds": busy,
            "idle_seconds": idle,
            "hourly_price": hourly_price,
        },
    )
    gpu_usage_sample(workers=[worker], now=datetime(2025, 6, 1, 9, tzinfo=UTC))


@pytest.fixture
def sampled_day(tenant_factory, record_factory):
    sample("m1", busy=2700.0, idle=900.0, hourly_price="4")
    record_factory(tenant_factory(), DAY, 300_000, 0, 700_000, model="m1")


def test_staff_see_the_gpu_report_with_chart_data(staff, sampled_day):
    response = staff.get(
        reverse("billing:gpu_report"), {"start": "2025-06-01", "end": "2025-06-02"}
    )
    assert response.status_code == 200
    chart = json.loads(
        re.search(r'id="gpu-chart-data"[^>]*>(.*?)</script>', response.content.decode()).group(1)
    )
    assert chart["rows"] == [
        {"day": "2025-06-01", "model": "m1", "cpm": 4.0, "idle": 0.25, "cost": 4.0}
    ]
    assert b"vendor/chart.umd.js" in response.content


def test_the_gpu_report_csv_has_one_row_per_day_and_model(staff, sampled_day):
    response = staff.get(
        reverse("billing:gpu_report_csv"), {"start": "2025-06-01", "end": "2025-06-01"}
    )
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert (
        response["Content-Disposition"]
        == 'attachment; filename="gpu-cost-2025-06-01-2025-06-01.csv"'
    )
    assert len(rows) == 1
    assert (rows[0]["model"], rows[0]["gpu_cost"], rows[0]["useful_tokens"]) == (
        "m1",
        "4",
        "1000000",
    )
    assert (rows[0]["cost_per_million_useful"], rows[0]["idle_share"]) == ("4", "0.25")


def test_the_gpu_report_is_for_staff_only(client, user_factory):
    client.force_login(user_factory(role="admin"))
    response = client.get(reverse("billing:gpu_report"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.fixture
def issued(tenant_factory, price_factory, record_factory):
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2025, 1, 1), "2", "1", "8")
    record_factory(tenant, date(2025, 3, 3), 1_000_000, 0, 250_000)
    invoice, _ = invoice_issue(tenant_id=tenant.pk, period=date(2025, 3, 1))
    return invoice


def test_tenant_admins_see_and_download_their_invoices(client, user_factory, issued):
    client.force_login(user_factory(tenant=issued.tenant, role="admin"))
    listing = client.get(reverse("billing:invoices"))
    assert issued.number in listing.content.decode()
    detail = client.get(reverse("billing:invoice", args=[issued.number]))
    assert '<th class="num" id="invoice-total">4.00</th>' in detail.content.decode()
    assert '<td class="num">8</td>' in detail.content.decode()  # completion price as set
    rows = list(
        csv.reader(
            io.StringIO(
                client.get(reverse("billing:invoice_csv", args=[issued.number])).content.decode()
            )
        )
    )
    assert rows[1][0] == "billing-test-model" and rows[1][-1] == "4.00"
    assert rows[1][rows[0].index("adjustment")] == "False"
    assert rows[-1] == ["total", "", "", "", "", "", "", "", "", "", "", "4.00"]


def test_members_and_other_tenants_get_no_invoices(client, user_factory, issued):
    client.force_login(user_factory(tenant=issued.tenant, role="member"))
    assert client.get(reverse("billing:invoices")).status_code == 403
    client.force_login(user_factory(role="admin"))  # an admin of another tenant
    assert client.get(reverse("billing:invoice", args=[issued.number])).status_code == 404
    assert client.get(reverse("billing:invoice_csv", args=[issued.number])).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_a_background_report_run_shows_progress_then_its_csv(staff, sampled_day, celery_worker):
    """The build runs on the Celery worker; the status endpoint ends in SUCCESS with the
    CSV link, and the CSV holds the same figures as the inline report."""
    response = staff.post(reverse("billing:gpu_report_build") + "?start=2025-05-01&end=2025-06-30")
    assert response.status_code == 302
    status_url = response["Location"] + "status/"
    deadline = time.monotonic() + 60
    while (body := staff.get(status_url).json())["state"] != "SUCCESS":
        assert body["state"] in ("PENDING", "STARTED", "PROGRESS"), body
        assert time.monotonic() < deadline, body
        time.sleep(0.2)
    assert (body["done"], body["total"]) == (1, 1)
    rows = list(csv.DictReader(io.StringIO(staff.get(body["csv"]).content.decode())))
    assert [(r["day"], r["model"], r["gpu_cost"]) for r in rows] == [("2025-06-01", "m1", "4")]


def test_staff_download_the_daily_rollups(staff, tenant_factory, price_factory, record_factory):
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2025, 1, 1), "1", "1", "1")
    record_factory(tenant, DAY, 1_000_000, 0, 500_000, source="console")
    daily_usage_rollup(day=DAY)
    response = staff.get(
        reverse("billing:rollup_csv"), {"start": "2025-06-01", "end": "2025-06-01"}
    )
    (row,) = csv.DictReader(io.StringIO(response.content.decode()))
    assert (row["tenant"], row["api_key"], row["requests"], row["cost"]) == (
        tenant.name,
        "Console",
        "1",
        "1.5",
    )


def test_long_ranges_are_offered_as_a_background_run(staff):
    response = staff.get(
        reverse("billing:gpu_report"), {"start": "2025-01-01", "end": "2025-06-30"}
    )
    body = response.content.decode()
    assert "181 days is more than 31" in body
    assert 'id="gpu-chart-data"' not in body and "chart.umd.js" not in body


def test_costs_carry_the_currency_and_small_costs_are_not_zero(staff, sampled_day, settings):
    settings.BILLING_CURRENCY = "EUR"
    page = staff.get(
        reverse("billing:gpu_report"), {"start": "2025-06-01", "end": "2025-06-02"}
    ).content.decode()
    assert "4.00 EUR" in page
    assert 'id="no-samples"' not in page and 'id="no-price"' not in page


def test_an_unsampled_report_says_why_it_has_no_charts(staff, tenant_factory, record_factory):
    """Usage but no GPU samples (plain bin/run has no Celery beat): no blank
    charts, a note naming the cause instead."""
    record_factory(tenant_factory(), DAY, 1_000, 0, 2_000, model="m1")
    page = staff.get(
        reverse("billing:gpu_report"), {"start": "2025-06-01", "end": "2025-06-01"}
    ).content.decode()
    assert 'id="no-samples"' in page and "bin/run --topology" in page
    assert 'id="cpm-chart"' not in page and "vendor/chart.umd.js" not in page


def test_a_report_of_unpriced_workers_says_so(staff):
    sample("m0", busy=60.0, idle=60.0, hourly_price="0")
    page = staff.get(
        reverse("billing:gpu_report"), {"start": "2025-06-01", "end": "2025-06-01"}
    ).content.decode()
    assert 'id="no-price"' in page and "WORKER_HOURLY_PRICE" in page
    assert 'id="cpm-chart"' in page
