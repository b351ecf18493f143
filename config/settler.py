"""The in-process usage settler: where no Celery beat runs it (embedded mode,
or ``bin/run`` serving a single web process), a daemon thread settles the
usage stream every ``USAGE_SETTLE_INTERVAL`` seconds, as the beat task does
in the multi-process topology.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections, connection

from billing.services import usage_settle_pending
from billing.tasks import settler_name

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_thread: threading.Thread | None = None


def start() -> threading.Thread:
    """Start the process's settler thread once; returns it."""
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="usage-settler", daemon=True)
            _thread.start()
        return _thread


def _run() -> None:
    consumer = settler_name("web")
    stop = threading.Event()
    while not stop.wait(settings.USAGE_SETTLE_INTERVAL):
        close_old_connections()
        try:
            usage_settle_pending(consumer=consumer)
        except Exception:
            # Retried next interval; unsettled entries stay in the stream.
            logger.exception("usage settlement failed")
        finally:
            connection.close()
