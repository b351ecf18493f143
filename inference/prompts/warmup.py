"""Load the active models' tokenizers when the web process starts.

The web tier tokenizes every prompt itself (``inference.prompts.prepare``), and the
first load of a tokenizer takes seconds (transformers' import, then the
tokenizer files), under a lock every request arriving meanwhile waits on.
Left to the first request, a burst of 24 chats against a fresh Daphne
spent its first seconds there (py-spy of Daphne during ``bench.serving``'s
first wave): their time to first token counted the load, not the queue.
"""

from __future__ import annotations

import logging
import threading

from django.db import connection

from fleet.selectors import served_model_dir, served_model_list_active
from tokenization.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


def tokenizers_warm() -> int:
    """Load the tokenizer of every active served model; how many loaded.

    A model that fails to load is logged and left to its first request,
    which then answers the error the way it always did.
    """
    loaded = 0
    try:
        for model in served_model_list_active():
            try:
                load_tokenizer(str(served_model_dir(model=model)))
                loaded += 1
            except Exception:
                logger.exception("tokenizer warm-up: %s did not load", model.name)
    finally:
        # This thread's own connection: not left open for the process's life.
        connection.close()
    return loaded


def tokenizers_warm_in_background() -> threading.Thread:
    """``tokenizers_warm`` in a daemon thread, so the server starts at once."""
    thread = threading.Thread(target=_warm_logged, name="tokenizer-warm", daemon=True)
    thread.start()
    return thread


def _warm_logged() -> None:
    try:
        logger.info("tokenizer warm-up: %d loaded", tokenizers_warm())
    except Exception:
        # The database may not be migrated yet; requests load on demand.
        logger.exception("tokenizer warm-up failed")
