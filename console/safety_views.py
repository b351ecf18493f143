"""The console's Safety page: a tenant admin's policy (within the tier's bounds)
and the events moderation recorded. One call deep, like console.views."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render

from console.access import tenant_admin
from console.views import form_errors
from safety import selectors
from safety.models import CHECK_CHOICES, PII_CHOICES
from safety.services import tenant_safety_policy_update

DEFAULT = [("", "The tier's default")]
OUTPUT = [("", "The tier's default"), ("on", "On"), ("off", "Off")]


class SafetyPolicyForm(forms.Form):
    classifier_action = forms.ChoiceField(
        label="Offensive-language classifier", choices=DEFAULT + CHECK_CHOICES, required=False
    )
    classifier_threshold = forms.FloatField(
        label="Classifier threshold",
        required=False,
        min_value=0.01,
        max_value=1.0,
        help_text="Probability from which a text counts as offensive. Blank: the tier's.",
    )
    pii_action = forms.ChoiceField(
        label="PII in prompts", choices=DEFAULT + PII_CHOICES, required=False
    )
    deny_action = forms.ChoiceField(
        label="Deny list", choices=DEFAULT + CHECK_CHOICES, required=False
    )
    deny_terms = forms.CharField(
        label="Denied words and phrases",
        required=False,
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text="One per line; matched as whole words, in prompts and replies.",
    )
    output_moderation = forms.ChoiceField(
        label="Moderate streamed replies", choices=OUTPUT, required=False
    )
    store_text = forms.BooleanField(
        label="Keep the text of flagged events (PII redacted)", required=False
    )

    def clean_output_moderation(self) -> bool | None:
        return {"on": True, "off": False}.get(self.cleaned_data["output_moderation"])


def _initial(row) -> dict:
    if row is None:
        return {}
    output = {True: "on", False: "off"}.get(row.output_moderation, "")
    return {
        "classifier_action": row.classifier_action,
        "classifier_threshold": row.classifier_threshold,
        "pii_action": row.pii_action,
        "deny_action": row.deny_action,
        "deny_terms": row.deny_terms,
        "output_moderation": output,
        "store_text": row.store_text,
    }


@tenant_admin
def safety(request):
    tenant = request.tenant
    form = SafetyPolicyForm(
        request.POST or None, initial=_initial(selectors.tenant_policy_get(tenant=tenant))
    )
    if request.method == "POST" and form.is_valid():
        try:
            tenant_safety_policy_update(tenant=tenant, **form.cleaned_data)
        except ValidationError as exc:
            form_errors(form, exc)
        else:
            messages.success(request, "Safety policy saved.")
            return redirect("console:safety")
    context = {
        "form": form,
        "bounds": selectors.tier_bounds(tier=tenant.tier),
        "policy": selectors.policy_for_tenant(tenant=tenant),
        "events": selectors.safety_event_list(tenant=tenant),
    }
    return render(request, "console/safety.html", context, status=400 if form.errors else 200)
