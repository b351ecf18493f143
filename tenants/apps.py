from django.apps import AppConfig


class TenantsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tenants"

    def ready(self) -> None:
        from auditlog.registry import auditlog

        from tenants.models import ApiKey, Invitation, Membership, Tenant, Tier

        # The audit log (docs/architecture.md, "Security"): every save and
        # delete of these rows, with the acting user. Hashes and salts are
        # never copied into it; last_used_at changes on every request.
        auditlog.register(Tier)
        auditlog.register(Tenant, exclude_fields=["cache_salt"])
        auditlog.register(Membership)
        auditlog.register(ApiKey, exclude_fields=["secret_hash", "last_used_at"])
        auditlog.register(Invitation, exclude_fields=["token_hash"])
