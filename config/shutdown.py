"""SIGTERM on a web (Daphne) process: drain its responses, then stop.

Twisted's own SIGTERM handler stops the reactor at once, and Daphne's
"before shutdown" trigger then cancels every application instance: open
SSE streams were cut mid-response. Daphne has no ASGI lifespan and no
drain of its own (``application_close_timeout`` only bounds apps whose
client already left). So once the reactor runs (its handlers are
installed in "during startup"; ``callWhenRunning`` comes after), this
replaces the SIGTERM handler: the first signal runs ``inference.admission.drain``
(new responses 503, open ones finish within ``WEB_DRAIN_SECONDS``, the
rest end ``server_shutdown``) and then stops the reactor, so Daphne exits
0; a second signal stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from django.conf import settings

from inference.admission.drain import drain

logger = logging.getLogger(__name__)

_background: set[asyncio.Task] = set()


def install() -> bool:
    """Hook the drain into Daphne's reactor; False when not under Daphne."""
    # Importing the reactor outside Daphne would install Twisted's default
    # one, and Daphne needs its asyncio reactor: only touch a running setup.
    if "daphne.server" not in sys.modules:
        return False
    from twisted.internet import reactor

    reactor.callWhenRunning(_take_sigterm, reactor)
    return True


def _take_sigterm(reactor) -> None:
    loop = asyncio.get_event_loop()
    signals = 0

    def on_sigterm(signum, frame) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            loop.call_soon_threadsafe(_start_drain, reactor)
        else:
            logger.warning("second SIGTERM: stopping without waiting")
            reactor.callFromThread(reactor.stop)

    signal.signal(signal.SIGTERM, on_sigterm)


def _start_drain(reactor) -> None:
    task = asyncio.get_running_loop().create_task(_drain_then_stop(reactor))
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _drain_then_stop(reactor) -> None:
    logger.warning("SIGTERM: draining for up to %ss", settings.WEB_DRAIN_SECONDS)
    try:
        report = await drain(settings.WEB_DRAIN_SECONDS)
        logger.warning(
            "drained in %.1fs: %d responses open at SIGTERM, %d ended server_shutdown",
            report.seconds,
            report.open_at_start,
            report.shut_down,
        )
    finally:
        if reactor.running:
            reactor.stop()
