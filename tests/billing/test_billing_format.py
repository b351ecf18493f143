"""billing_format: money shown with its currency, small amounts not as zero."""

from decimal import Decimal

import pytest

from billing.templatetags.billing_format import money


@pytest.mark.parametrize(
    "value, shown",
    [
        (Decimal("1234.5"), "1,234.50 USD"),
        (Decimal("0.01"), "0.01 USD"),
        (Decimal("0"), "0.00 USD"),
        (Decimal("0.0000068"), "0.0000068 USD"),
        (6.84e-06, "0.0000068 USD"),
        (Decimal("0.004567"), "0.0046 USD"),
        (None, "–"),
    ],
)
def test_money(settings, value, shown):
    settings.BILLING_CURRENCY = "USD"
    assert money(value) == shown


def test_money_takes_another_currency():
    assert money(Decimal("2"), "EUR") == "2.00 EUR"
