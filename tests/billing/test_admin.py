"""The billing admin: usage and invoices read-only, prices append-only."""

from datetime import date

import pytest
from django.urls import reverse

from billing.models import Price
from billing.services import invoice_issue
from tests.usage_records import record_usage

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.tenants.admin_urls")]


def test_usage_records_are_listed_but_not_editable(admin_client, tenant_factory):
    """Staff can list and filter usage; add and change are forbidden."""
    tenant = tenant_factory()
    record, _ = record_usage(
        response_id="chatcmpl-admin",
        tenant_id=tenant.pk,
        model="m",
        source="api",
        status="completed",
        finish_reason="stop",
        prompt_tokens=1,
        cached_tokens=0,
        completion_tokens=2,
        queue_time_ms=0,
        ttft_ms=1,
        duration_ms=2,
    )
    changelist = reverse("admin:billing_usagerecord_changelist")
    response = admin_client.get(changelist, {"status__exact": "completed"})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 1
    assert admin_client.get(reverse("admin:billing_usagerecord_add")).status_code == 403
    change = reverse("admin:billing_usagerecord_change", args=[record.pk])
    assert admin_client.post(change, {"model": "other"}).status_code == 403
    record.refresh_from_db()
    assert record.model == "m"


def test_an_invoice_shows_whether_it_reproduces(
    admin_client, tenant_factory, price_factory, record_factory
):
    """The invoice's admin page recomputes it from the records; nothing is editable."""
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2025, 1, 1), "1", "1", "1")
    record_factory(tenant, date(2025, 3, 3), 1_000_000, 0, 0)
    invoice, _ = invoice_issue(tenant_id=tenant.pk, period=date(2025, 3, 1))
    page = admin_client.get(reverse("admin:billing_invoice_change", args=[invoice.pk]))
    assert page.status_code == 200 and "1.00" in page.content.decode()
    assert '<div class="readonly">yes</div>' in page.content.decode()
    assert admin_client.get(reverse("admin:billing_invoice_add")).status_code == 403


def test_a_price_cannot_be_edited_once_saved(admin_client, price_factory, tiers):
    """A price change is a new row: the saved one's fields are read-only, so a
    complete, valid change form is accepted yet changes none of them."""
    price = price_factory("pro", date(2025, 1, 1), "1", "1", "1")
    before = Price.objects.values().get(pk=price.pk)
    change = reverse("admin:billing_price_change", args=[price.pk])
    # Every field of the price form, each with a new valid value: were the
    # fields editable, this form would be saved and change every one of them.
    form = {
        "model": "other-model",
        "tier": tiers["enterprise"].pk,
        "effective_from": "2025-02-01",
        "prompt_per_million": "9",
        "cached_prompt_per_million": "8",
        "completion_per_million": "7",
        "_save": "Save",
    }
    response = admin_client.post(change, form)
    # Saved and redirected, not re-shown with errors: the form was complete.
    assert response.status_code == 302
    assert response.url == reverse("admin:billing_price_changelist")
    assert Price.objects.values().get(pk=price.pk) == before
