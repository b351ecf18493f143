"""Writes for the console: chat (``chat``) and tenant administration (``team``)."""

from console.services.chat import (
    Reply,
    chat_regenerate,
    chat_send,
    conversation_delete,
    reply_attach,
    reply_detach,
    reply_finish,
    reply_frames,
    reply_open,
    reply_release,
    reply_stop,
)
from console.services.team import (
    api_key_set_limits,
    member_invite,
    member_remove,
    member_set_role,
)

__all__ = [
    "Reply",
    "api_key_set_limits",
    "chat_regenerate",
    "chat_send",
    "conversation_delete",
    "member_invite",
    "member_remove",
    "member_set_role",
    "reply_attach",
    "reply_release",
    "reply_detach",
    "reply_finish",
    "reply_frames",
    "reply_open",
    "reply_stop",
]
