from django.apps import AppConfig


class BillingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "billing"

    def ready(self) -> None:
        from auditlog.registry import auditlog

        from billing.models import BudgetPolicy, Price

        # Audit log: price and budget-policy changes (the budget itself is
        # Tenant.monthly_budget, logged with the tenant).
        auditlog.register(Price)
        auditlog.register(BudgetPolicy)
