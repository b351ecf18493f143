"""``manage.py bootstrap``: a deployment's first tenant, its admin and an API key.

Run by docker/compose.yaml's one-shot ``bootstrap`` service after the
migrations; idempotent, so it runs on every ``up``. Input comes from the
command line or, as Django's ``createsuperuser --noinput`` reads
``DJANGO_SUPERUSER_*``, from the environment:

- ``BOOTSTRAP_TENANT`` (required): the tenant's name.
- ``BOOTSTRAP_TIER``: its tier (free, pro, enterprise; default pro).
- ``BOOTSTRAP_ADMIN_USER``, ``BOOTSTRAP_ADMIN_EMAIL`` (required): the admin,
  a superuser (the site's first operator) and the tenant's admin member.
- ``BOOTSTRAP_ADMIN_PASSWORD`` (required the first time): checked by the
  site's password validators; never changed by a later run.
- ``BOOTSTRAP_API_KEY_FILE``: where the new API key is written (mode 0600);
  default: only printed.

A second run changes nothing and creates no key while the tenant has its
``bootstrap`` key; ``--new-key`` makes another one. Unlike ``seed_demo`` it
sets no prices and runs in production mode.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from tenants.models import ApiKey, Membership, Tier
from tenants.services import api_key_create, membership_create, tenant_get_or_create

KEY_NAME = "bootstrap"


class Command(BaseCommand):
    help = "Create the first tenant, its admin user and an API key (idempotent)."

    def add_arguments(self, parser):
        env = os.environ.get
        parser.add_argument("--tenant", default=env("BOOTSTRAP_TENANT", ""))
        parser.add_argument("--tier", default=env("BOOTSTRAP_TIER", "pro"))
        parser.add_argument("--admin-user", default=env("BOOTSTRAP_ADMIN_USER", ""))
        parser.add_argument("--admin-email", default=env("BOOTSTRAP_ADMIN_EMAIL", ""))
        parser.add_argument("--api-key-file", default=env("BOOTSTRAP_API_KEY_FILE", ""))
        parser.add_argument("--new-key", action="store_true", help="create another API key")

    def handle(self, *args, tenant: str, tier: str, admin_user: str, admin_email: str,
               api_key_file: str, new_key: bool, **options):  # fmt: skip
        missing = [
            name
            for name, value in (
                ("BOOTSTRAP_TENANT", tenant),
                ("BOOTSTRAP_ADMIN_USER", admin_user),
                ("BOOTSTRAP_ADMIN_EMAIL", admin_email),
            )
            if not value.strip()
        ]
        if missing:
            raise CommandError(f"Set {', '.join(missing)} (or the matching options).")
        if not Tier.objects.filter(name=tier).exists():
            names = ", ".join(Tier.objects.order_by("name").values_list("name", flat=True))
            raise CommandError(f"No tier {tier!r}: one of {names}.")
        with transaction.atomic():
            org, created = tenant_get_or_create(name=tenant.strip(), tier_name=tier)
            self._say(f"Tenant {org.name!r} ({org.tier.name})", created)
            user = self._admin(admin_user.strip(), admin_email.strip())
            if not Membership.objects.filter(user=user, tenant=org).exists():
                membership_create(user=user, tenant=org, role=Membership.Role.ADMIN)
            has_key = ApiKey.objects.filter(tenant=org, name=KEY_NAME).exists()
            if has_key and not new_key:
                self.stderr.write(f"API key {KEY_NAME!r} exists (shown when it was created).")
                return
            _, raw_key = api_key_create(tenant=org, name=KEY_NAME, created_by=user)
            # Inside the transaction: a key that could not be handed over
            # is not kept either.
            if api_key_file:
                _write_private(Path(api_key_file), raw_key + "\n")
                self.stderr.write(f"API key {KEY_NAME!r} created; written to {api_key_file}.")
            else:
                self.stderr.write(f"API key {KEY_NAME!r} created (shown once):")
                self.stdout.write(raw_key)

    def _admin(self, username: str, email: str):
        users = get_user_model()
        user = users.objects.filter(username=username).first()
        if user is not None:
            self._say(f"Admin {username!r}", False)
            return user
        password = os.environ.get("BOOTSTRAP_ADMIN_PASSWORD", "")
        if not password:
            raise CommandError("Set BOOTSTRAP_ADMIN_PASSWORD to create the admin user.")
        candidate = users(username=username, email=email)
        try:
            validate_password(password, user=candidate)
        except ValidationError as exc:
            raise CommandError(f"BOOTSTRAP_ADMIN_PASSWORD: {' '.join(exc.messages)}") from exc
        user = users.objects.create_superuser(username=username, email=email, password=password)
        self._say(f"Admin {username!r}", True)
        return user

    def _say(self, what: str, created: bool) -> None:
        self.stderr.write(f"{what} {'created' if created else 'exists'}.")


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)
