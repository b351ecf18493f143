"""Console pages: sign-in, tenant scoping and who may open what."""

import csv
import io
import re
import uuid

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from console.models import Conversation, Message
from tenants.models import ApiKey, Membership
from tests.plugins.request_path import DEMO
from tests.redis_helpers import redis_test_url, redis_up
from tests.usage_records import record_usage
from wire.bus import get_worker_bus, reset_buses
from wire.workers import WorkerInfo, WorkerState

pytestmark = pytest.mark.django_db

TENANT_PAGES = ["/chat/", "/api-keys/", "/usage/", "/usage/export.csv"]


def record(tenant, *, model=DEMO, api_key=None, completion=10, ttft=None, worker="w1"):
    return record_usage(
        response_id=f"chatcmpl-{uuid.uuid4().hex}",
        tenant_id=tenant.pk,
        api_key_id=api_key.pk if api_key else None,
        model=model,
        source="api" if api_key else "console",
        status="completed",
        finish_reason="stop",
        prompt_tokens=20,
        cached_tokens=0,
        completion_tokens=completion,
        queue_time_ms=1,
        ttft_ms=ttft,
        duration_ms=100,
        worker_id=worker,
    )[0]


@pytest.fixture
def member(user_factory):
    return user_factory(role="member")


@pytest.fixture
def admin(user_factory):
    return user_factory(role="admin")


@pytest.mark.parametrize("path", [*TENANT_PAGES, "/team/", "/fleet/", "/fleet/capacity/"])
def test_anonymous_is_sent_to_sign_in(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_sign_in_and_out(client, member, demo_model):
    """Username and password lead to the chat; logging out ends the session."""
    response = client.post(
        "/accounts/login/", {"username": member.username, "password": "pw"}, follow=True
    )
    assert response.redirect_chain[-1][0] == "/chat/"
    assert b"New chat" in response.content and member.username.encode() in response.content
    client.post("/accounts/logout/")
    assert client.get("/chat/").status_code == 302


def test_wrong_password_is_refused(client, member):
    response = client.post("/accounts/login/", {"username": member.username, "password": "no"})
    assert response.status_code == 200 and b"correct username and password" in response.content


@pytest.mark.parametrize("path", ["/team/", "/fleet/", "/fleet/capacity/"])
def test_member_cannot_reach_admin_or_fleet_pages(client, member, path):
    client.force_login(member)
    assert client.get(path).status_code == 403


def test_member_nav_hides_team_and_fleet(client, member, demo_model):
    client.force_login(member)
    page = client.get("/chat/").content.decode()
    assert 'href="/team/"' not in page and 'href="/fleet/"' not in page


def test_tenant_admin_cannot_reach_fleet(client, admin):
    client.force_login(admin)
    assert client.get("/team/").status_code == 200
    assert client.get("/fleet/").status_code == 403


def test_tenant_admin_sees_only_their_tenant(client, admin, user_factory, api_key_factory):
    """Team lists only the admin's members; another tenant's ids are 404s."""
    outsider = user_factory(role="member")
    other_key, _ = api_key_factory(tenant=outsider.membership.tenant)
    colleague = user_factory(tenant=admin.membership.tenant)
    client.force_login(admin)
    page = client.get("/team/").content.decode()
    assert colleague.username in page and outsider.username not in page
    foreign = outsider.membership.pk
    assert client.post(f"/team/members/{foreign}/role/", {"role": "admin"}).status_code == 404
    assert client.post(f"/team/members/{foreign}/remove/").status_code == 404
    assert client.get(f"/team/keys/{other_key.pk}/limits/").status_code == 404
    assert client.post(f"/api-keys/{other_key.pk}/revoke/").status_code == 404
    outsider.membership.refresh_from_db()
    other_key.refresh_from_db()
    assert outsider.membership.role == "member" and other_key.revoked_at is None


def test_conversations_are_private(client, member, user_factory, demo_model):
    """Another user's conversation is a 404, in the same tenant or another."""
    same_tenant = user_factory(tenant=member.membership.tenant)
    theirs = Conversation.objects.create(
        tenant=same_tenant.membership.tenant, user=same_tenant, title="theirs", model=DEMO
    )
    mine = Conversation.objects.create(
        tenant=member.membership.tenant, user=member, title="mine", model=DEMO
    )
    Message.objects.create(conversation=mine, role="user", content="hello there")
    client.force_login(member)
    assert client.get(f"/chat/{theirs.pk}/").status_code == 404
    assert client.post(f"/chat/{theirs.pk}/delete/").status_code == 404
    page = client.get(f"/chat/{mine.pk}/").content.decode()
    assert "hello there" in page and "theirs" not in page


def test_model_picker_lists_only_the_tiers_models(client, member, demo_model, tiers):
    from fleet.services import served_model_register

    served_model_register(name="enterprise-only", context_length=4096, tiers=[tiers["enterprise"]])
    client.force_login(member)
    page = client.get("/chat/").content.decode()
    assert f'value="{DEMO}"' in page and "enterprise-only" not in page


def test_api_key_secret_is_shown_once_and_revocable(client, admin):
    client.force_login(admin)
    response = client.post("/api-keys/", {"name": "ci"})
    key = ApiKey.objects.get(tenant=admin.membership.tenant, name="ci")
    raw = response.context["created"]["raw_key"]
    assert raw.startswith(key.prefix + ".") and raw.encode() in response.content
    listing = client.get("/api-keys/").content.decode()
    assert key.prefix in listing and raw not in listing
    client.post(f"/api-keys/{key.pk}/revoke/")
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_usage_page_and_csv(client, member, api_key_factory):
    """Per model and per key, the page and the CSV carry the tenant's usage only."""
    tenant = member.membership.tenant
    key, _ = api_key_factory(tenant=tenant, name="batch")
    record(tenant, completion=7)
    record(tenant, api_key=key, completion=5)
    record(api_key_factory()[0].tenant, completion=999)  # another tenant
    client.force_login(member)
    page = client.get("/usage/?days=7&by=api_key")
    assert page.status_code == 200
    chart = page.context["chart"]
    assert {d["label"] for d in chart["tokens"]} == {"Console", str(key)}
    assert sum(sum(d["data"]) for d in chart["tokens"]) == 27 + 25
    assert b"vendor/chart.umd.js" in page.content
    # Every cost with its currency; unpriced usage reads 0.00, not 0.0000.
    assert chart["currency"] == settings.BILLING_CURRENCY
    cells = re.findall(r'<td class="num">([^<]*)</td></tr>', page.content.decode())
    assert cells and all(c.endswith(" " + settings.BILLING_CURRENCY) for c in cells)

    export = client.get("/usage/export.csv?days=7&by=model")
    assert export["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(export.content.decode())))
    assert [(r["model"], r["completion_tokens"], r["total_tokens"]) for r in rows] == [
        (DEMO, "12", "52")
    ]
    assert rows[0]["day"] == timezone.now().date().isoformat() and rows[0]["cost"] != ""


def test_team_admin_changes_and_removes_members(client, admin, user_factory, api_key_factory):
    """Role changes stick; removing a member also revokes the keys made for them."""
    colleague = user_factory(tenant=admin.membership.tenant)
    membership = colleague.membership
    key, _ = api_key_factory(tenant=admin.membership.tenant, owner=colleague)
    client.force_login(admin)

    client.post(f"/team/members/{membership.pk}/role/", {"role": "admin"})
    membership.refresh_from_db()
    assert membership.role == "admin"
    client.post(f"/team/members/{membership.pk}/remove/")
    assert not Membership.objects.filter(pk=membership.pk).exists()
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_last_admin_cannot_be_demoted(client, admin):
    client.force_login(admin)
    response = client.post(
        f"/team/members/{admin.membership.pk}/role/", {"role": "member"}, follow=True
    )
    admin.membership.refresh_from_db()
    assert admin.membership.role == "admin"
    assert b"at least one admin" in response.content


def test_key_limits_stay_within_the_tier(client, admin, api_key_factory):
    """pro allows 600 RPM: 50 is saved, 601 is refused with the tier's limit."""
    key, _ = api_key_factory(tenant=admin.membership.tenant)
    client.force_login(admin)
    url = f"/team/keys/{key.pk}/limits/"
    assert client.post(url, {"rpm_limit": "50", "tpm_limit": ""}).status_code == 302
    key.refresh_from_db()
    assert (key.rpm_limit, key.tpm_limit) == (50, None)
    response = client.post(url, {"rpm_limit": "601", "tpm_limit": ""})
    assert response.status_code == 200 and b"Must not exceed" in response.content
    key.refresh_from_db()
    assert key.rpm_limit == 50


def test_fleet_shows_live_workers_and_ttft(client, admin_user, fake_worker, tenant_factory):
    """Staff see each worker's state and KV from its heartbeat, TTFT from usage."""
    worker = fake_worker(worker_id="fleet-w1")
    tenant = tenant_factory()
    for ttft in (10, 20, 30, 40, 200):
        record(tenant, ttft=ttft, worker="fleet-w1")
    client.force_login(admin_user)
    response = client.get("/fleet/")
    assert response.status_code == 200
    row = next(r for r in response.context["workers"] if r["info"].worker_id == worker.worker_id)
    assert row["info"].state == "ready"
    assert row["ttft"]["p50"] == 30 and row["ttft"]["count"] == 5
    assert row["ttft"]["p95"] > 40
    assert b"fleet-w1" in response.content


def test_fleet_reads_worker_state_from_redis(client, admin_user, settings):
    """With the Redis bus (as under Daphne), heartbeats give state and KV use."""
    url = redis_test_url("redis://127.0.0.1:6379/5")
    if not redis_up(url):
        pytest.skip("Redis is not running")
    settings.REDIS_URL = url
    reset_buses()
    bus = get_worker_bus()
    info = WorkerInfo(
        worker_id=f"warming-{uuid.uuid4().hex[:6]}",
        model=DEMO,
        state=WorkerState.WARMING,
        kv_blocks_used=3,
        kv_blocks_total=12,
        waiting=2,
    )
    bus.register(info)
    try:
        client.force_login(admin_user)
        response = client.get("/fleet/")
    finally:
        bus.deregister(info.worker_id)
        reset_buses()
    row = next(r for r in response.context["workers"] if r["info"].worker_id == info.worker_id)
    assert (row["info"].state, row["info"].waiting, row["kv_percent"]) == ("warming", 2, 25.0)
    assert b"3 / 12 blocks" in response.content


def test_capacity_calculator_page(client, admin_user):
    client.force_login(admin_user)
    response = client.get("/fleet/capacity/?preset=70b")
    report = response.context["report"]
    assert report.kv_bytes_per_token == 327_680 and report.reservation_gib == 2.5
    assert b"327680 bytes" in response.content
    custom = client.get(
        "/fleet/capacity/",
        {
            "layers": 32,
            "kv_heads": 8,
            "head_dim": 128,
            "params_billion": 8,
            "context_length": 8192,
            "gpu_memory_gib": 24,
            "runtime_reserve_gib": 2,
            "kv_dtype_bytes": "2",
        },
    )
    assert custom.context["report"].kv_bytes_per_token == 131_072
    # The default preset is the served demo model, from its config.json.
    demo = client.get("/fleet/capacity/").context["form"]
    assert (demo["layers"].value(), demo["kv_heads"].value()) == (30, 3)


def test_django_admin_works_for_staff(client, admin_user):
    client.force_login(admin_user)
    assert client.get("/admin/").status_code == 200
    assert client.get(reverse("admin:console_conversation_changelist")).status_code == 200


def test_user_without_tenant_sees_why(client, django_user_model):
    user = django_user_model.objects.create_user(username="nobody", password="pw")
    client.force_login(user)
    response = client.get("/chat/")
    assert response.status_code == 403 and b"belongs to no tenant" in response.content
