"""Safety's periodic work (Celery beat)."""

from celery import shared_task

from safety import services


@shared_task(name="safety.tasks.events_purge")
def events_purge() -> dict[str, int]:
    deleted, blanked = services.safety_events_purge()
    return {"deleted": deleted, "texts_blanked": blanked}
