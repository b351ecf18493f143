"""The usage admin is read-only."""

import pytest
from django.urls import reverse

from billing.services import usage_record_create

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.tenants.admin_urls")]


def test_usage_records_are_listed_but_not_editable(admin_client, tenant_factory):
    """Staff can list and filter usage; add and change are forbidden."""
    tenant = tenant_factory()
    record, _ = usage_record_create(
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
