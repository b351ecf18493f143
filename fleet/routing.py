"""The routing key: which conversation a request continues.

A conversation's turns must land where its KV blocks are, so the key must
be the same on every turn: the system prompt plus a conversation id. The
OpenAI API has no conversation id; the ``X-Conversation-Id`` header (or
the console's conversation) gives one. Without it, the first user message
stands in, since every later turn repeats it, together with the ``user``
field so two end users opening alike still spread. Hashing the whole
request would send every turn somewhere new (its tail changes each turn).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def conversation_routing_key(
    *, messages: Iterable[Any], conversation_id: str | None = None, user: str | None = None
) -> str:
    """``messages``: objects with ``role`` and ``text`` (the API's schema)."""
    messages = list(messages)
    system = "\n".join(m.text for m in messages if m.role in ("system", "developer"))
    if conversation_id:
        return f"{_digest(system)}:c:{conversation_id}"
    first = next((m.text for m in messages if m.role == "user"), "")
    opening = _digest((user or "") + "\n" + first)
    return f"{_digest(system)}:u:{opening}"
