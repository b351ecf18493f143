"""``manage.py seed_demo``: a demo tenant, its admin user and one API key.

Run by ``bin/run`` so a newcomer can log in and call the API at once.
Local mode only (``DJANGO_ENV=local``): a known superuser password has no
place on a deployed site.
Idempotent: a second run keeps the tenant and user and prints no new key
unless ``--new-key`` is given. The key is shown once and also written to
``.cache/demo-api-key`` (git-ignored) for the README's quickstarts.
"""

import os
from datetime import date
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from billing.services import price_set
from tenants.models import Membership, Tier
from tenants.selectors import api_key_authenticate
from tenants.services import api_key_create, membership_create, tenant_get_or_create

KEY_FILE = Path(settings.DEMO_API_KEY_FILE)
# Demo list prices per 1M tokens (prompt, cached prompt, completion), so the
# usage page and invoices show costs from the first request.
DEMO_PRICES = {
    "free": ("0", "0", "0"),
    "pro": ("0.10", "0.05", "0.40"),
    "enterprise": ("0.08", "0.04", "0.32"),
}


class Command(BaseCommand):
    help = "Create the demo tenant (pro tier), an admin user and an API key."

    def add_arguments(self, parser):
        parser.add_argument("--new-key", action="store_true", help="Create another API key.")

    def handle(self, *args, new_key: bool, **options):
        if not settings.LOCAL:
            raise CommandError(
                "seed_demo creates a superuser with a known password: local mode only "
                "(DJANGO_ENV=local). Deployments use createsuperuser."
            )
        username = os.environ.get("DEMO_ADMIN_USER", "admin")
        password = os.environ.get("DEMO_ADMIN_PASSWORD", "admin")
        with transaction.atomic():
            tenant, _ = tenant_get_or_create(name="demo", tier_name="pro")
            user_model = get_user_model()
            user, user_created = user_model.objects.get_or_create(
                username=username, defaults={"is_staff": True, "is_superuser": True}
            )
            if user_created:
                user.set_password(password)
                user.save(update_fields=["password"])
                self.stderr.write(f"Created user {username!r} (password {password!r}); change it.")
            if not Membership.objects.filter(user=user).exists():
                membership_create(user=user, tenant=tenant, role=Membership.Role.ADMIN)
            for tier in Tier.objects.filter(name__in=DEMO_PRICES):
                prompt, cached, completion = (Decimal(v) for v in DEMO_PRICES[tier.name])
                price_set(
                    model=settings.DEMO_MODEL_NAME,
                    tier=tier,
                    effective_from=date(2026, 1, 1),
                    prompt_per_million=prompt,
                    cached_prompt_per_million=cached,
                    completion_per_million=completion,
                )
            raw_key = None
            # A key file left over from another database does not count.
            saved = KEY_FILE.read_text().strip() if KEY_FILE.exists() else ""
            if new_key or api_key_authenticate(raw_key=saved) is None:
                _, raw_key = api_key_create(tenant=tenant, name="demo")
        if raw_key:
            KEY_FILE.parent.mkdir(parents=True, exist_ok=True)
            KEY_FILE.write_text(raw_key + "\n")
            KEY_FILE.chmod(0o600)
            self.stderr.write(f"Demo API key (shown once, also in {KEY_FILE}):")
            self.stdout.write(raw_key)
        else:
            self.stderr.write(f"Demo tenant ready; its API key is in {KEY_FILE}.")
