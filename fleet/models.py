"""The control plane's rows: the model catalog, deployments, routing
thresholds, rollouts, shadow pairs.

None of these is read on the request path: ``fleet.snapshot`` publishes
them (with the tiers) to Redis as one versioned document, and the web
processes and workers route from that.
"""

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class ServedModel(models.Model):
    """A model the platform serves under ``name`` (the OpenAI ``model`` field).

    ``path`` is a Hugging Face directory on the web and worker hosts; blank
    means the demo model directory, resolved at run time so the catalog row
    does not pin a host-specific cache path.
    """

    name = models.CharField(max_length=128, unique=True)
    path = models.CharField(max_length=512, blank=True)
    context_length = models.PositiveIntegerField(
        help_text="Longest prompt + completion the model itself supports."
    )
    tiers = models.ManyToManyField(
        "tenants.Tier",
        related_name="served_models",
        blank=True,
        help_text="Tiers whose keys may call this model; others get 404 model_not_found.",
    )
    is_active = models.BooleanField(default=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        # The catalog began in the inference app; its table kept the name.
        db_table = "inference_servedmodel"

    def __str__(self) -> str:
        return self.name


class Deployment(models.Model):
    """One version of a served model and the share of its traffic it gets."""

    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        # Kept loaded after a rollout so a rollback is only a routing change.
        WARM_STANDBY = "warm_standby", "Warm standby"
        RETIRED = "retired", "Retired"

    model_name = models.CharField(max_length=128, help_text="The served model name (API).")
    version = models.CharField(max_length=64)
    weights_path = models.CharField(
        max_length=512, blank=True, help_text="Hugging Face directory; blank: the catalog's."
    )
    replicas = models.PositiveIntegerField(default=1, help_text="Replicas the operator wants.")
    traffic_weight = models.PositiveIntegerField(
        default=100,
        validators=[MaxValueValidator(100)],
        help_text="Percent of the model's traffic (versions of a model share 100).",
    )
    hourly_price = models.DecimalField(
        max_digits=10, decimal_places=4, default=0, help_text="Cost of one replica per hour."
    )
    warmup_seconds = models.PositiveIntegerField(
        default=120, help_text="Load + warm-up time of a new replica (autoscaling horizon)."
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model_name", "version"]
        constraints = [
            models.UniqueConstraint(fields=["model_name", "version"], name="deployment_unique")
        ]

    def __str__(self) -> str:
        return f"{self.model_name}@{self.version} ({self.traffic_weight}%)"


class RoutingSettings(models.Model):
    """Thresholds of the cache-aware router; one row (pk 1)."""

    max_kv_usage = models.FloatField(
        default=0.85,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Affinity is honoured only while the replica's KV usage is below this.",
    )
    max_queue = models.PositiveIntegerField(
        default=8, help_text="... and its running + waiting requests are below this."
    )
    successors = models.PositiveIntegerField(
        default=3,
        validators=[MinValueValidator(1)],
        help_text="Ring successors compared by load when affinity is refused.",
    )
    virtual_nodes = models.PositiveIntegerField(default=64, validators=[MinValueValidator(1)])
    # Autoscaling signal: per-replica admitted tokens and the queue age that
    # call for more capacity, and the spare replicas kept warm.
    target_tokens_per_replica = models.PositiveIntegerField(default=8192)
    max_queue_age_seconds = models.FloatField(default=2.0)
    warm_reserve = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "routing settings"

    def __str__(self) -> str:
        return "Routing settings"


class Rollout(models.Model):
    """A canary version ramped through traffic steps, with guardrails at each."""

    class State(models.TextChoices):
        RAMPING = "ramping", "Ramping"
        COMPLETED = "completed", "Completed"
        ROLLED_BACK = "rolled_back", "Rolled back"

    model_name = models.CharField(max_length=128)
    stable_version = models.CharField(max_length=64)
    canary_version = models.CharField(max_length=64)
    steps = models.JSONField(default=list, help_text="Canary traffic percent per step.")
    step_index = models.PositiveIntegerField(default=0)
    dwell_seconds = models.FloatField(default=600.0)
    # Share of stable-path requests also run on the canary, never shown.
    shadow_share = models.FloatField(
        default=0.0, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    # Seconds the stable version stays loaded after completion.
    grace_seconds = models.FloatField(default=3600.0)
    # Guardrail limits: {"min_requests", "error_rate", "ttft_p95", ...}.
    guardrails = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.RAMPING)
    step_started_at = models.DateTimeField()
    results = models.JSONField(default=list, blank=True, help_text="One guardrail check per step.")
    reason = models.TextField(blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    grace_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["model_name"],
                condition=models.Q(state="ramping"),
                name="one_ramping_rollout_per_model",
            )
        ]

    def __str__(self) -> str:
        return f"{self.model_name} {self.stable_version} -> {self.canary_version} ({self.state})"

    @property
    def canary_percent(self) -> int:
        if self.state == self.State.ROLLED_BACK:
            return 0
        if self.state == self.State.COMPLETED:
            return 100
        return int(self.steps[self.step_index])

    def clean(self) -> None:
        super().clean()
        steps = self.steps or []
        if not steps or any(not isinstance(s, int) or not 0 < s <= 100 for s in steps):
            raise ValidationError({"steps": "Give rising integer percents in 1..100."})
        if steps != sorted(set(steps)) or steps[-1] != 100:
            raise ValidationError({"steps": "Steps must rise strictly and end at 100."})
        if self.stable_version == self.canary_version:
            raise ValidationError({"canary_version": "The canary must differ from stable."})


class ShadowComparison(models.Model):
    """One request run on both versions; only the stable output was shown."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="shadows")
    # Whose request it was (the tenant opted in); their data, deleted with them.
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, null=True, related_name="+"
    )
    response_id = models.CharField(max_length=64, unique=True)
    shadow_response_id = models.CharField(max_length=64)
    prompt_tokens = models.PositiveIntegerField()
    stable_version = models.CharField(max_length=64)
    canary_version = models.CharField(max_length=64)
    stable_text = models.TextField()
    canary_text = models.TextField()
    stable_completion_tokens = models.PositiveIntegerField()
    canary_completion_tokens = models.PositiveIntegerField()
    stable_status = models.CharField(max_length=16)
    canary_status = models.CharField(max_length=16)
    identical = models.BooleanField()
    # Indexed: the retention purge deletes by age (SHADOW_RETENTION_DAYS).
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"shadow of {self.response_id}"
