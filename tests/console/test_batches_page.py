"""The console's Batches page: tenant admins see and run their batches, staff see all."""

from __future__ import annotations

import io
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from batches.models import Batch
from batches.services.files import file_write
from tenants.models import Membership

pytestmark = pytest.mark.django_db

LINE = {
    "custom_id": "a",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}]},
}


@pytest.fixture(autouse=True)
def batch_files(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "batches": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }


@pytest.fixture
def admin(user_factory):
    return user_factory(role=Membership.Role.ADMIN, tier="pro")


def tenant_of(user):
    return Membership.objects.get(user=user).tenant


def start(client, admin, api_key_factory) -> Batch:
    key, _ = api_key_factory(tenant=tenant_of(admin))
    upload = SimpleUploadedFile("r.jsonl", json.dumps(LINE).encode() + b"\n")
    response = client.post(
        "/batches/",
        {"file": upload, "endpoint": "/v1/chat/completions", "api_key": key.pk},
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    return Batch.objects.get(tenant=tenant_of(admin))


def test_a_member_cannot_open_it(client, user_factory):
    client.force_login(user_factory(role=Membership.Role.MEMBER))
    assert client.get("/batches/").status_code == 403
    assert client.get("/batches/progress.json").status_code == 403


def test_an_admin_starts_a_batch_and_sees_only_the_tenants_own(
    client, admin, user_factory, api_key_factory
):
    client.force_login(admin)
    batch = start(client, admin, api_key_factory)
    assert (batch.status, batch.endpoint) == ("validating", "/v1/chat/completions")
    page = client.get("/batches/").content.decode()
    assert batch.pk in page and "Cancel" in page
    assert f"Batches · {tenant_of(admin).name}" in page
    other = user_factory(role=Membership.Role.ADMIN)
    client.force_login(other)
    assert batch.pk not in client.get("/batches/").content.decode()
    assert client.post(f"/batches/{batch.pk}/cancel/").status_code == 404
    progress = client.get("/batches/progress.json").json()
    assert progress == {"batches": []}


def test_cancel_and_progress(client, admin, api_key_factory):
    client.force_login(admin)
    batch = start(client, admin, api_key_factory)
    response = client.post(f"/batches/{batch.pk}/cancel/")
    assert response.status_code == 302
    batch.refresh_from_db()
    assert batch.status == "cancelling" and batch.cancelling_at
    (row,) = client.get("/batches/progress.json").json()["batches"]
    assert (row["id"], row["status"], row["done"]) == (batch.pk, "cancelling", False)


def test_staff_see_every_tenants_batches_and_download_their_files(
    client, admin, api_key_factory, django_user_model
):
    client.force_login(admin)
    batch = start(client, admin, api_key_factory)
    batch.output_file = file_write(tenant=batch.tenant, filename="out.jsonl", data=b'{"x":1}\n')
    batch.status = "completed"
    batch.save()
    staff = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    client.force_login(staff)
    page = client.get("/batches/").content.decode()
    assert batch.pk in page and batch.tenant.name in page and "Batches · all tenants" in page
    response = client.get(f"/batches/{batch.pk}/output/")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b'{"x":1}\n'
    assert client.get(f"/batches/{batch.pk}/errors/").status_code == 404


def test_a_bad_upload_says_why(client, admin, api_key_factory, tiers):
    tiers["pro"].max_batch_file_bytes = 10
    tiers["pro"].save()
    client.force_login(admin)
    key, _ = api_key_factory(tenant=tenant_of(admin))
    upload = SimpleUploadedFile("r.jsonl", io.BytesIO(json.dumps(LINE).encode()).read())
    response = client.post(
        "/batches/", {"file": upload, "endpoint": "/v1/chat/completions", "api_key": key.pk}
    )
    assert response.status_code == 200
    assert "limit for batch files is 10 bytes" in response.content.decode()
    assert not Batch.objects.exists()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_progress_moves_live_over_the_socket(admin_async, api_key_factory, user_factory):
    """The admin's socket sends the tenant's batches, then what changed; a
    member's socket is refused."""
    from asgiref.sync import sync_to_async

    from tests.console.sockets import open_socket_at

    admin, batch = admin_async
    socket = await open_socket_at("/ws/batches/", admin)
    frame = await socket.receive_json_from(timeout=10)
    assert frame["type"] == "batches"
    assert [(b["id"], b["status"], b["completed"]) for b in frame["batches"]] == [
        (batch.pk, "validating", 0)
    ]
    await sync_to_async(Batch.objects.filter(pk=batch.pk).update)(
        status="in_progress", total=3, completed=2
    )
    frame = await socket.receive_json_from(timeout=10)
    (row,) = frame["batches"]
    assert (row["status"], row["completed"], row["total"], row["done"]) == (
        "in_progress",
        2,
        3,
        False,
    )
    await socket.disconnect()
    member = await sync_to_async(user_factory)(role=Membership.Role.MEMBER)
    refused = await open_socket_at("/ws/batches/", member, expect_accept=False)
    assert not refused.was_accepted


@pytest.fixture
def admin_async(admin, api_key_factory):
    """The admin and a batch of the tenant's (made before the async test runs)."""
    key, _ = api_key_factory(tenant=tenant_of(admin))
    file = file_write(tenant=key.tenant, filename="in.jsonl", data=json.dumps(LINE).encode())
    file.purpose = "batch"
    file.save()
    from batches.services.batches import batch_create

    batch = batch_create(
        api_key=key, input_file_id=file.pk, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return admin, batch
