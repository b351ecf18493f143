"""``manage.py create_api_key --tenant NAME --tier TIER [--name NAME]``.

Creates the tenant if it does not exist, then a new API key. The raw key is
the last line of stdout (and the only thing written there), so scripts can
capture it with ``KEY=$(python manage.py create_api_key ... | tail -n1)``.
"""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from tenants.models import Tier
from tenants.selectors import tier_get
from tenants.services import api_key_create, tenant_get_or_create, tenant_set_tier


class Command(BaseCommand):
    help = "Create an API key for a tenant (creating the tenant if needed); prints the key."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="Tenant name.")
        parser.add_argument("--tier", required=True, help="Tier name: free, pro, enterprise.")
        parser.add_argument("--name", default="default", help="A label for the key.")
        parser.add_argument(
            "--set-tier",
            action="store_true",
            help="Move an existing tenant on another tier to --tier.",
        )

    def handle(self, *args, tenant: str, tier: str, name: str, set_tier: bool, **options):
        try:
            tier_get(name=tier)
        except Tier.DoesNotExist:
            known = ", ".join(Tier.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"Unknown tier {tier!r} (known: {known}).") from None

        with transaction.atomic():
            tenant_obj, created = tenant_get_or_create(name=tenant, tier_name=tier)
            if not created and tenant_obj.tier.name != tier:
                if not set_tier:
                    raise CommandError(
                        f"Tenant {tenant!r} is on the {tenant_obj.tier.name!r} tier, "
                        f"not {tier!r}; pass --set-tier to move it."
                    )
                tenant_set_tier(tenant=tenant_obj, tier_name=tier)
            api_key, raw_key = api_key_create(tenant=tenant_obj, name=name)

        verb = "Created" if created else "Using existing"
        self.stderr.write(
            f"{verb} tenant {tenant_obj.name!r} ({tenant_obj.tier.name}); "
            f"key {api_key.prefix} (shown once, store it now):"
        )
        if not tenant_obj.is_active:
            self.stderr.write("Warning: the tenant is inactive; the key will not authenticate.")
        self.stdout.write(raw_key)
