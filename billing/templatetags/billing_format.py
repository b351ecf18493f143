"""Numbers of money for people: ``decimal_text`` for unit prices as written,
``money`` for amounts with the billing currency."""

from decimal import Decimal, InvalidOperation

from django import template
from django.conf import settings

from billing.selectors.reports import csv_text

register = template.Library()


@register.filter
def decimal_text(value) -> str:
    """A unit price as written (0.15, 2, 0.0000001), without padding zeros."""
    return csv_text(value)


@register.filter
def money(value, currency: str | None = None) -> str:
    """``value`` with its currency: "1.25 USD"; a cost too small for cents keeps
    two significant digits ("0.0000068 USD") rather than reading as zero."""
    if value is None or value == "":
        return "–"
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    currency = currency or settings.BILLING_CURRENCY
    if amount == 0 or abs(amount) >= Decimal("0.01"):
        text = f"{amount.quantize(Decimal('0.01')):,}"
    else:
        # adjusted() is the exponent of the first significant digit.
        places = -amount.adjusted() + 1
        text = f"{amount.quantize(Decimal(1).scaleb(-places)):f}"
    return f"{text} {currency}"
