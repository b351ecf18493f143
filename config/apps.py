from django.apps import AppConfig


class PlatformConfig(AppConfig):
    """The composition root: wires the layers together once apps are ready.

    Lower layers never import higher ones, so what they need from above is
    handed in here: where the bus is (``wire.bus``) and how to start the
    embedded worker (``inference.relay.dispatch``).
    """

    name = "config"
    label = "platform"

    def ready(self) -> None:
        from django.conf import settings

        from inference.relay.dispatch import embedded_worker_register
        from wire.bus import BusConfig, configure

        configure(
            lambda: BusConfig(
                redis_url=settings.REDIS_URL,
                response_ttl=settings.RESPONSE_STREAM_TTL,
                heartbeat_ttl=settings.WORKER_HEARTBEAT_TTL,
                usage_stream_key=settings.USAGE_STREAM_KEY,
            )
        )
        embedded_worker_register(_embedded_start)


def _embedded_start():
    # Imported on first use: the worker and its engine (torch) load only in a
    # process that runs the embedded engine, never in a plain web process.
    from config import embedded

    return embedded.start()
