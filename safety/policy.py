"""What a tenant's requests are checked for, and what a finding leads to.

Staff set each tier's defaults and bounds (``TierSafetyPolicy``); a tenant's
admins choose within them (``TenantSafetyPolicy``). ``policy_resolve`` merges
the two into the ``Policy`` the request path uses, clamping a tenant choice
that the tier's bounds no longer allow (staff may tighten a tier later).
Plain Python: the merge is tested without a database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Action(StrEnum):
    OFF = "off"  # the check does not run
    FLAG = "flag"  # recorded, the request goes on
    REDACT = "redact"  # PII only: replaced by <ENTITY> before the model sees it
    BLOCK = "block"  # prompt refused (400) / reply cut (content_filter)


STRICTNESS = {Action.OFF: 0, Action.FLAG: 1, Action.REDACT: 2, Action.BLOCK: 3}
CHECK_ACTIONS = (Action.OFF, Action.FLAG, Action.BLOCK)
PII_ACTIONS = (Action.OFF, Action.FLAG, Action.REDACT, Action.BLOCK)


@dataclass(slots=True, frozen=True)
class TierBounds:
    """A tier's defaults for its tenants and the limits of their choices."""

    classifier_action: Action = Action.BLOCK
    classifier_threshold: float = 0.8
    # The laxest a tenant may go: an action at least this strict, a
    # threshold at most this high (a higher threshold flags less).
    classifier_min_action: Action = Action.FLAG
    classifier_max_threshold: float = 0.95
    pii_action: Action = Action.REDACT
    pii_min_action: Action = Action.FLAG
    deny_action: Action = Action.BLOCK
    max_deny_terms: int = 200
    output_moderation: bool = True
    output_required: bool = False
    text_storage_allowed: bool = True


# A tier without a TierSafetyPolicy row, or while PostgreSQL is down.
DEFAULT_BOUNDS = {
    "free": TierBounds(
        classifier_min_action=Action.BLOCK,
        classifier_max_threshold=0.8,
        pii_min_action=Action.REDACT,
        max_deny_terms=20,
        output_required=True,
        text_storage_allowed=False,
    ),
    # Paying API tenants' prompts are not rewritten unless they ask: a
    # silently redacted address changes the answer. PII is flagged
    # (recorded, never stored in clear); redact or block is an opt-in.
    "pro": TierBounds(pii_action=Action.FLAG),
    "enterprise": TierBounds(
        pii_action=Action.FLAG,
        classifier_min_action=Action.OFF,
        classifier_max_threshold=1.0,
        pii_min_action=Action.OFF,
        max_deny_terms=1000,
    ),
}


def default_bounds(tier_name: str) -> TierBounds:
    # An unknown tier gets the strictest defaults, like the lowest tier.
    return DEFAULT_BOUNDS.get(tier_name, DEFAULT_BOUNDS["free"])


@dataclass(slots=True, frozen=True)
class TenantChoices:
    """A tenant's own settings; None (or blank) takes the tier's default."""

    classifier_action: Action | None = None
    classifier_threshold: float | None = None
    pii_action: Action | None = None
    deny_action: Action | None = None
    deny_terms: tuple[str, ...] = ()
    output_moderation: bool | None = None
    store_text: bool = False


@dataclass(slots=True, frozen=True)
class Policy:
    """The effective policy of one tenant's requests."""

    classifier: Action = Action.BLOCK
    threshold: float = 0.8
    pii: Action = Action.REDACT
    deny: Action = Action.BLOCK
    deny_terms: tuple[str, ...] = ()
    # Moderate the streamed reply (classifier and deny list).
    output: bool = True
    # Flagged events keep the text (redacted of PII) instead of a hash only.
    store_text: bool = False
    # Extra checks by name (a guard model later; stubs in tests).
    extra: tuple = field(default=())

    @property
    def checks_output(self) -> bool:
        return self.output and (
            self.classifier != Action.OFF
            or (self.deny != Action.OFF and bool(self.deny_terms))
            or bool(self.extra)
        )


def _at_least(choice: Action | None, default: Action, floor: Action) -> Action:
    action = choice or default
    return action if STRICTNESS[action] >= STRICTNESS[floor] else floor


def choice_errors(bounds: TierBounds, choices: TenantChoices) -> dict[str, str]:
    """Why ``choices`` are outside ``bounds``, by field; empty when they fit."""
    errors = {}
    if choices.classifier_action and (
        STRICTNESS[choices.classifier_action] < STRICTNESS[bounds.classifier_min_action]
    ):
        errors["classifier_action"] = (
            f"Your tier allows at least '{bounds.classifier_min_action}' for the classifier."
        )
    if choices.classifier_threshold is not None and not (
        0.0 < choices.classifier_threshold <= bounds.classifier_max_threshold
    ):
        errors["classifier_threshold"] = (
            f"The threshold must be above 0 and at most {bounds.classifier_max_threshold}."
        )
    if choices.pii_action and STRICTNESS[choices.pii_action] < STRICTNESS[bounds.pii_min_action]:
        errors["pii_action"] = f"Your tier allows at least '{bounds.pii_min_action}' for PII."
    for name in ("classifier_action", "deny_action"):
        if getattr(choices, name) == Action.REDACT:
            errors[name] = "Only PII can be redacted."
    if len(choices.deny_terms) > bounds.max_deny_terms:
        errors["deny_terms"] = f"Your tier allows at most {bounds.max_deny_terms} terms."
    if choices.output_moderation is False and bounds.output_required:
        errors["output_moderation"] = "Your tier requires moderation of replies."
    if choices.store_text and not bounds.text_storage_allowed:
        errors["store_text"] = "Your tier does not keep the text of flagged events."
    return errors


def policy_resolve(bounds: TierBounds, choices: TenantChoices | None = None) -> Policy:
    """The effective policy: the tenant's choices within the tier's bounds."""
    c = choices or TenantChoices()
    threshold = c.classifier_threshold or bounds.classifier_threshold
    output = bounds.output_moderation if c.output_moderation is None else c.output_moderation
    return Policy(
        classifier=_at_least(
            c.classifier_action, bounds.classifier_action, bounds.classifier_min_action
        ),
        threshold=min(threshold, bounds.classifier_max_threshold),
        pii=_at_least(c.pii_action, bounds.pii_action, bounds.pii_min_action),
        deny=c.deny_action or bounds.deny_action,
        deny_terms=c.deny_terms[: bounds.max_deny_terms],
        output=output or bounds.output_required,
        store_text=c.store_text and bounds.text_storage_allowed,
    )
