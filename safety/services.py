"""Writes: a tenant's policy within its tier's bounds, and moderation events."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from safety.checks.denylist import MAX_TERM_CHARS, normalize_terms
from safety.checks.pii import pii_redact
from safety.models import SafetyEvent, TenantSafetyPolicy
from safety.policy import Action, TenantChoices, choice_errors
from safety.selectors import policy_cache_forget, tier_bounds
from tenants.models import Tenant

# The stored text of an event: enough context to review, never a whole prompt.
MAX_STORED_CHARS = 2000


@transaction.atomic
def tenant_safety_policy_update(
    *,
    tenant: Tenant,
    classifier_action: str = "",
    classifier_threshold: float | None = None,
    pii_action: str = "",
    deny_action: str = "",
    deny_terms: str = "",
    output_moderation: bool | None = None,
    store_text: bool = False,
) -> TenantSafetyPolicy:
    """Save a tenant admin's choices; ValidationError when the tier does not allow them."""
    terms = normalize_terms(deny_terms)
    long_terms = [t for t in terms if len(t) > MAX_TERM_CHARS]
    if long_terms:
        raise ValidationError(
            {"deny_terms": f"Terms are at most {MAX_TERM_CHARS} characters: {long_terms[0][:20]}…"}
        )
    choices = TenantChoices(
        classifier_action=Action(classifier_action) if classifier_action else None,
        classifier_threshold=classifier_threshold,
        pii_action=Action(pii_action) if pii_action else None,
        deny_action=Action(deny_action) if deny_action else None,
        deny_terms=terms,
        output_moderation=output_moderation,
        store_text=store_text,
    )
    errors = choice_errors(tier_bounds(tier=tenant.tier), choices)
    if errors:
        raise ValidationError(errors)
    policy, _ = TenantSafetyPolicy.objects.select_for_update().get_or_create(tenant=tenant)
    policy.classifier_action = classifier_action
    policy.classifier_threshold = classifier_threshold
    policy.pii_action = pii_action
    policy.deny_action = deny_action
    policy.deny_terms = "\n".join(terms)
    policy.output_moderation = output_moderation
    policy.store_text = store_text
    policy.full_clean()
    policy.save()
    transaction.on_commit(lambda: policy_cache_forget(tenant_id=tenant.pk))
    return policy


def safety_event_record(
    *,
    tenant_id: int,
    stage: str,
    outcome: str,
    findings: list[dict],
    text: str,
    store_text: bool,
    model: str = "",
    request_ref: str = "",
    source: str = "",
    api_key_id: int | None = None,
    user_id: int | None = None,
) -> SafetyEvent:
    """Record one moderation event; the text only if the tenant opted in."""
    event = SafetyEvent(
        tenant_id=tenant_id,
        api_key_id=api_key_id,
        user_id=user_id,
        source=source,
        stage=stage,
        outcome=outcome,
        model=model,
        request_ref=request_ref[:64],
        findings=findings,
        # PII never lands in the event table, opted in or not.
        text=pii_redact(text)[:MAX_STORED_CHARS] if store_text else "",
        text_sha256=hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
        text_chars=len(text),
    )
    event.full_clean()
    event.save()
    return event


def safety_events_purge(*, now: datetime | None = None) -> tuple[int, int]:
    """Retention, on the beat: delete events older than
    SAFETY_EVENT_RETENTION_DAYS, and blank the kept text of tenants that
    have withdrawn their opt-in. Returns (deleted, texts blanked)."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.SAFETY_EVENT_RETENTION_DAYS)
    deleted, _ = SafetyEvent.objects.filter(created_at__lt=cutoff).delete()
    opted_in = TenantSafetyPolicy.objects.filter(store_text=True).values("tenant_id")
    blanked = SafetyEvent.objects.exclude(text="").exclude(tenant_id__in=opted_in).update(text="")
    return deleted, blanked
