"""Monthly invoices and their lines."""

from decimal import ROUND_HALF_UP, Decimal

from django.db import models

from billing.models.pricing import UNIT_PRICE

CENT = Decimal("0.01")


def to_cents(amount: Decimal) -> Decimal:
    """Round a money amount to cents, half up (the one rounding rule)."""
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


class Invoice(models.Model):
    """One tenant's bill for one calendar month (UTC), issued once.

    Rounding rule: each line's amount is the exact sum of its usage at its
    price, rounded to cents half up; the total is the sum of the rounded
    lines, so the printed lines always add up to the printed total. Costs
    are never rounded anywhere else. Unique on (tenant, period): issuing
    again, concurrently or after a retried task, returns the first invoice.
    """

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="invoices")
    # The first day of the billed month.
    period = models.DateField()
    number = models.CharField(max_length=32, unique=True)
    currency = models.CharField(max_length=3)
    total = models.DecimalField(max_digits=14, decimal_places=2)
    issued_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-period", "tenant"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "period"], name="invoice_tenant_period_unique"
            )
        ]

    def __str__(self) -> str:
        return self.number


class InvoiceLine(models.Model):
    """Usage of one model at one price: a mid-month price change makes two lines.

    An adjustment line bills usage of earlier months that was settled after
    its month's invoice had been issued (a worker's usage entry delivered
    late), at the price it carries; its days lie before the invoice's month.
    """

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    model = models.CharField(max_length=128)
    price = models.ForeignKey("billing.Price", on_delete=models.PROTECT, related_name="+")
    # The days (inclusive) of the month this price applied to usage.
    first_day = models.DateField()
    last_day = models.DateField()
    requests = models.PositiveIntegerField()
    prompt_tokens = models.PositiveBigIntegerField()
    cached_tokens = models.PositiveBigIntegerField()
    completion_tokens = models.PositiveBigIntegerField()
    prompt_per_million = models.DecimalField(**UNIT_PRICE)
    cached_prompt_per_million = models.DecimalField(**UNIT_PRICE)
    completion_per_million = models.DecimalField(**UNIT_PRICE)
    # The fraction of the unit prices this line pays: 1, or the batch
    # discount its Batch API usage was recorded at (a line of its own).
    price_multiplier = models.DecimalField(max_digits=4, decimal_places=3, default=Decimal(1))
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    adjustment = models.BooleanField(default=False)

    class Meta:
        ordering = ["adjustment", "model", "first_day", "-price_multiplier"]
        constraints = [
            models.UniqueConstraint(
                fields=["invoice", "model", "price", "adjustment", "price_multiplier"],
                name="invoice_line_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.invoice_id} {self.model} {self.first_day}..{self.last_day}"
