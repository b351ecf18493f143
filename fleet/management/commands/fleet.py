"""``manage.py fleet publish|deploy|rollout|rollback``: the control plane from a shell."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from fleet import services
from fleet.tasks import rollout_begin


class Command(BaseCommand):
    help = "Publish the fleet snapshot, register deployments, start or roll back rollouts."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("publish", help="publish the control snapshot now")
        deploy = sub.add_parser("deploy", help="register model@version")
        deploy.add_argument("model")
        deploy.add_argument("version")
        deploy.add_argument("--weights-path", default="")
        deploy.add_argument("--replicas", type=int, default=1)
        deploy.add_argument("--hourly-price", type=float, default=0.0)
        deploy.add_argument("--warmup-seconds", type=int, default=120)
        rollout = sub.add_parser("rollout", help="start a canary rollout (Celery runs the steps)")
        rollout.add_argument("model")
        rollout.add_argument("canary_version")
        rollout.add_argument("--steps", default="1,5,25,100")
        rollout.add_argument("--dwell-seconds", type=float, default=600.0)
        rollout.add_argument("--shadow-share", type=float, default=0.0)
        rollout.add_argument("--grace-seconds", type=float, default=3600.0)
        back = sub.add_parser("rollback", help="send all traffic back to stable")
        back.add_argument("rollout_id", type=int)

    def handle(self, *args, action: str, **options) -> None:
        try:
            self.stdout.write(str(self._run(action, options)))
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc

    def _run(self, action: str, options):
        if action == "publish":
            return f"snapshot version {services.snapshot_publish()}"
        if action == "deploy":
            deployment = services.deployment_register(
                model_name=options["model"],
                version=options["version"],
                weights_path=options["weights_path"],
                replicas=options["replicas"],
                hourly_price=options["hourly_price"],
                warmup_seconds=options["warmup_seconds"],
            )
            return f"registered {deployment}"
        if action == "rollout":
            task = rollout_begin.delay(
                model_name=options["model"],
                canary_version=options["canary_version"],
                steps=[int(s) for s in options["steps"].split(",")],
                dwell_seconds=options["dwell_seconds"],
                shadow_share=options["shadow_share"],
                grace_seconds=options["grace_seconds"],
            )
            return f"rollout queued (task {task.id})"
        rollout = services.rollout_rollback(rollout_id=options["rollout_id"])
        return f"rollout {rollout.pk}: {rollout.state}"
