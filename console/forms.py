"""Console forms: input checks only; the rules live in the services."""

from __future__ import annotations

from django import forms

from console.capacity import ModelShape
from tenants.models import Membership


class ApiKeyCreateForm(forms.Form):
    """A tenant admin's new key: for a member or tenant-wide, with an expiry
    and an optional allow-list of the tier's models."""

    EXPIRIES = [
        ("", "Never"),
        ("7", "7 days"),
        ("30", "30 days"),
        ("90", "90 days"),
        ("365", "1 year"),
    ]

    name = forms.CharField(max_length=128, help_text="What the key is for, e.g. 'staging'.")
    owner = forms.ModelChoiceField(
        queryset=None, required=False, empty_label="Tenant-wide (admins only)", label="For"
    )
    expires_in_days = forms.TypedChoiceField(
        choices=EXPIRIES, coerce=int, empty_value=None, required=False, label="Expires"
    )
    allowed_models = forms.MultipleChoiceField(
        choices=[],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Models",
        help_text="None ticked: every model of the tier.",
    )

    def __init__(self, *args, members, model_names: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["owner"].queryset = members
        self.fields["owner"].label_from_instance = lambda user: user.get_username()
        self.fields["allowed_models"].choices = [(name, name) for name in model_names]


class InviteForm(forms.Form):
    email = forms.EmailField(label="Email")
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER)


class InvitationAcceptForm(forms.Form):
    """The invitee's new account; password rules are the service's (validators)."""

    username = forms.CharField(max_length=150)
    password1 = forms.CharField(label="Password", widget=forms.PasswordInput, strip=False)
    password2 = forms.CharField(label="Password again", widget=forms.PasswordInput, strip=False)

    def clean(self):
        data = super().clean()
        if data.get("password1") != data.get("password2"):
            self.add_error("password2", "The two passwords differ.")
        return data


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Membership.Role.choices)


class KeyLimitsForm(forms.Form):
    rpm_limit = forms.IntegerField(
        label="Requests per minute", required=False, min_value=1, help_text="Blank: the tier's."
    )
    tpm_limit = forms.IntegerField(
        label="Tokens per minute", required=False, min_value=1, help_text="Blank: the tier's."
    )


class UsageFilterForm(forms.Form):
    PERIODS = [(7, "Last 7 days"), (30, "Last 30 days"), (90, "Last 90 days")]
    GROUPS = [("model", "Model"), ("api_key", "API key")]

    days = forms.TypedChoiceField(choices=PERIODS, coerce=int, initial=30, required=False)
    by = forms.ChoiceField(choices=GROUPS, initial="model", required=False)

    def values(self) -> tuple[int, str]:
        if not self.is_valid():
            return 30, "model"
        return self.cleaned_data.get("days") or 30, self.cleaned_data.get("by") or "model"


class CapacityForm(forms.Form):
    """A model's config and one GPU; weight precisions are the table's rows."""

    layers = forms.IntegerField(min_value=1, max_value=1000)
    kv_heads = forms.IntegerField(label="KV heads", min_value=1, max_value=1024)
    head_dim = forms.IntegerField(label="Head dim", min_value=1, max_value=4096)
    params_billion = forms.FloatField(label="Parameters (billions)", min_value=0.0001)
    context_length = forms.IntegerField(
        label="Reservation length (tokens)", min_value=1, max_value=10_000_000
    )
    gpu_memory_gib = forms.FloatField(label="GPU memory (GiB)", min_value=0.1)
    runtime_reserve_gib = forms.FloatField(
        label="Runtime reserve (GiB)",
        min_value=0,
        initial=0,
        help_text="Activations, CUDA graphs and the allocator's slack.",
    )
    kv_dtype_bytes = forms.TypedChoiceField(
        label="KV cache element",
        choices=[("2", "FP16/BF16 (2 bytes)"), ("1", "FP8 (1 byte)")],
        coerce=float,
        initial="2",
    )

    def shape(self) -> ModelShape:
        data = self.cleaned_data
        return ModelShape(
            layers=data["layers"],
            kv_heads=data["kv_heads"],
            head_dim=data["head_dim"],
            params_billion=data["params_billion"],
            context_length=data["context_length"],
        )
