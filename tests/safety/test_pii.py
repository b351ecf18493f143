"""PII recognizers and redaction: what they catch and what they leave alone."""

import pytest

from safety.checks.pii import luhn_valid, pii_find, pii_redact


@pytest.mark.parametrize(
    ("text", "entity"),
    [
        ("write to jane.doe+news@example.co.uk today", "EMAIL_ADDRESS"),
        ("call +1 (415) 555-0132 after six", "PHONE_NUMBER"),
        ("call 415-555-0132 after six", "PHONE_NUMBER"),
        ("ring +44 20 7946 0958", "PHONE_NUMBER"),
        ("card 4111 1111 1111 1111 exp 12/29", "CREDIT_CARD"),
        ("card 5500-0000-0000-0004", "CREDIT_CARD"),
        ("ssn 123-45-6789", "US_SSN"),
        ("NI number AB 12 34 56 C", "UK_NINO"),
        ("IBAN GB82 WEST 1234 5698 7654 32", "IBAN_CODE"),
    ],
)
def test_each_recognizer_finds_its_entity(text, entity):
    assert [f.category for f in pii_find(text)] == [entity]


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112",  # fails Luhn
        "0000 0000 0000 0000",  # passes Luhn, but no card
        "ssn 666-12-3456",  # area never issued
        "ssn 912-45-6789",
        "on 2024-01-15 at 10:30 we sold 1234 units",
        "version 3.11.2 at 10.0.0.1",
        "IBAN GB00 WEST 1234 5698 7654 32",  # wrong check digits
        "QQ 12 34 56 C",  # QQ is not an issued prefix
    ],
)
def test_lookalikes_are_not_pii(text):
    assert pii_find(text) == []


def test_luhn():
    assert luhn_valid("4111111111111111")
    assert luhn_valid("79927398713")
    assert not luhn_valid("79927398710")


def test_redaction_replaces_each_span_and_keeps_the_rest():
    text = "Mail jane@example.com or call 415-555-0132; card 4111111111111111."
    assert pii_redact(text) == "Mail <EMAIL_ADDRESS> or call <PHONE_NUMBER>; card <CREDIT_CARD>."


def test_a_card_number_is_not_also_reported_as_a_phone_number():
    assert [f.category for f in pii_find("4111 1111 1111 1111")] == ["CREDIT_CARD"]
