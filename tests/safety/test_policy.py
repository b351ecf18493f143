"""Tier bounds and tenant choices resolve to the effective policy."""

from safety.policy import (
    Action,
    TenantChoices,
    TierBounds,
    choice_errors,
    default_bounds,
    policy_resolve,
)


def test_without_choices_the_tier_defaults_apply():
    policy = policy_resolve(default_bounds("pro"))
    assert (policy.classifier, policy.threshold, policy.pii, policy.output) == (
        Action.BLOCK,
        0.8,
        Action.FLAG,
        True,
    )
    # The console-only free tier redacts PII and may not relax it.
    free = policy_resolve(default_bounds("free"))
    assert free.pii == Action.REDACT


def test_choices_within_bounds_are_taken():
    bounds = TierBounds(classifier_min_action=Action.FLAG, classifier_max_threshold=0.95)
    choices = TenantChoices(
        classifier_action=Action.FLAG, classifier_threshold=0.9, deny_terms=("foo",)
    )
    assert choice_errors(bounds, choices) == {}
    policy = policy_resolve(bounds, choices)
    assert (policy.classifier, policy.threshold, policy.deny_terms) == (
        Action.FLAG,
        0.9,
        ("foo",),
    )


def test_choices_outside_bounds_are_refused_and_clamped_if_stored():
    """A tier tightened after a tenant chose: the stored choice is clamped."""
    bounds = default_bounds("free")
    choices = TenantChoices(
        classifier_action=Action.OFF,
        classifier_threshold=0.99,
        pii_action=Action.FLAG,
        output_moderation=False,
        store_text=True,
        deny_terms=tuple(f"t{i}" for i in range(bounds.max_deny_terms + 1)),
    )
    assert set(choice_errors(bounds, choices)) == {
        "classifier_action",
        "classifier_threshold",
        "pii_action",
        "output_moderation",
        "store_text",
        "deny_terms",
    }
    policy = policy_resolve(bounds, choices)
    assert policy.classifier == Action.BLOCK
    assert policy.threshold == bounds.classifier_max_threshold
    assert policy.pii == Action.REDACT
    assert policy.output is True and policy.store_text is False
    assert len(policy.deny_terms) == bounds.max_deny_terms


def test_only_pii_can_be_redacted():
    errors = choice_errors(TierBounds(), TenantChoices(deny_action=Action.REDACT))
    assert "deny_action" in errors
