from django.apps import AppConfig


class FleetConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "fleet"
    verbose_name = "Fleet: deployments, routing and rollouts"

    def ready(self) -> None:
        from auditlog.registry import auditlog

        from fleet.fallback import _on_api_key_revoked
        from fleet.models import Deployment, Rollout
        from tenants.signals import api_key_revoked

        # A revoked key's cached authentication goes with it (every process).
        api_key_revoked.connect(_on_api_key_revoked, dispatch_uid="fleet.auth_cache_revoke")

        # Audit log: deployment changes (state, traffic weights) and rollouts.
        # A rollout's per-step guardrail results are its own record, not audit.
        auditlog.register(Deployment)
        auditlog.register(Rollout, exclude_fields=["results", "step_started_at"])
