"""The batches admin: files and batches listed for staff, never edited there."""

import pytest
from django.urls import reverse

from tests.batches.test_execution import new_batch

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.urls("tests.tenants.admin_urls"),
    pytest.mark.usefixtures("demo_model", "batch_files"),
]


def test_batches_and_files_are_listed_but_not_editable(admin_client, api_key_factory):
    key, _ = api_key_factory(tier="pro")
    batch = new_batch(key, 2)
    response = admin_client.get(
        reverse("admin:batches_batch_changelist"), {"status__exact": "in_progress"}
    )
    assert response.status_code == 200 and response.context["cl"].result_count == 1
    assert batch.pk in response.content.decode()
    files = admin_client.get(reverse("admin:batches_file_changelist"))
    assert files.context["cl"].result_count == 1
    assert admin_client.get(reverse("admin:batches_batch_add")).status_code == 403
    change = reverse("admin:batches_batch_change", args=[batch.pk])
    assert admin_client.post(change, {"status": "completed"}).status_code == 403
    batch.refresh_from_db()
    assert batch.status == "in_progress"
