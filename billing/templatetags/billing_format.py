"""``decimal_text``: a unit price as written (0.15, 2, 0.0000001), without padding zeros."""

from django import template

from billing.selectors.reports import csv_text

register = template.Library()


@register.filter
def decimal_text(value) -> str:
    return csv_text(value)
