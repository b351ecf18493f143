"""Budget policy per tenant and the alerts already sent."""

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class BudgetPolicy(models.Model):
    """How a tenant is warned about its monthly budget (``Tenant.monthly_budget``).

    The hard stop is the budget itself; the soft alert goes out once a month
    when spend reaches ``soft_alert_ratio`` of it. A tenant without a row
    gets the defaults.
    """

    DEFAULT_SOFT_ALERT_RATIO = Decimal("0.80")

    tenant = models.OneToOneField(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="budget_policy"
    )
    soft_alert_ratio = models.DecimalField(
        max_digits=3,
        decimal_places=2,
        default=DEFAULT_SOFT_ALERT_RATIO,
        validators=[MinValueValidator(Decimal("0.01")), MaxValueValidator(Decimal("1.00"))],
        help_text="Share of the monthly budget at which the soft alert is emailed.",
    )
    # Besides the tenant's admins.
    alert_email = models.EmailField(blank=True)

    class Meta:
        verbose_name_plural = "budget policies"

    def __str__(self) -> str:
        return f"{self.tenant} budget policy"

    def get_additional_data(self) -> dict:
        # The audit log's tenant, so tenant admins see their own entries.
        return {"tenant_id": self.tenant_id}


class BudgetAlert(models.Model):
    """An alert sent: at most one per tenant, month and kind."""

    class Kind(models.TextChoices):
        SOFT = "soft", "Soft threshold reached"
        HARD = "hard", "Budget exhausted"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    period = models.DateField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    spend = models.DecimalField(max_digits=24, decimal_places=16)
    budget = models.DecimalField(max_digits=12, decimal_places=2)
    recipients = models.TextField(blank=True)
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-sent_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "period", "kind"], name="budget_alert_once_per_month"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.period:%Y-%m} {self.kind}"
