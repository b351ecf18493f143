from django.apps import AppConfig


class SafetyConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "safety"

    def ready(self) -> None:
        from auditlog.registry import auditlog

        from safety.models import TenantSafetyPolicy, TierSafetyPolicy

        # Who relaxed or tightened a policy, and when (the audit log).
        auditlog.register(TierSafetyPolicy)
        auditlog.register(TenantSafetyPolicy)
