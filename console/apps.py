from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "console"
    verbose_name = "Web console"

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        from console.revocation import membership_deleted
        from tenants.models import Membership

        # However a membership goes (team page, admin), its sockets close.
        post_delete.connect(
            membership_deleted, sender=Membership, dispatch_uid="console.member_sockets_close"
        )
