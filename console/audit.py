"""Audit log entries as sentences a person reads: who did what to which thing.

django-auditlog stores each change as raw field values ("tier": ["None",
"2"], timestamps with microseconds, reverse relations as "None"). The
console's Audit page and the admin show them through ``audit_lines``:
one sentence per entry ("admin changed the membership “bob @ acme
(member)”") and one line per field that really changed, with the field's
name, choices as their labels, related rows by their names, times to the
minute.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from datetime import datetime

from auditlog.models import LogEntry
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.utils.dateparse import parse_datetime

_VERBS = {
    LogEntry.Action.CREATE: "created",
    LogEntry.Action.UPDATE: "changed",
    LogEntry.Action.DELETE: "deleted",
    LogEntry.Action.ACCESS: "viewed",
}
# Said by the entry's own time, or meaningless to a reader.
_SKIPPED_FIELDS = {"id", "created_at", "updated_at"}
_EMPTY = {"None", "", "[]", "{}"}
NONE = "—"


@dataclass(slots=True)
class AuditLine:
    """One audit entry, worded."""

    when: datetime
    actor: str
    action: str
    # The content type's model name (for filters and tests).
    model: str
    sentence: str
    changes: list[str] = field(default_factory=list)


class _Names:
    """Related rows by primary key, each looked up once per page."""

    def __init__(self) -> None:
        self._seen: dict[tuple[type[models.Model], str], str] = {}

    def get(self, model: type[models.Model], pk: str) -> str:
        key = (model, pk)
        if key not in self._seen:
            row = model._default_manager.filter(pk=pk).first()
            noun = model._meta.verbose_name
            self._seen[key] = str(row) if row is not None else f"deleted {noun} #{pk}"
        return self._seen[key]


def _value(model_field: models.Field, raw: str, names: _Names) -> str:
    """One stored value (auditlog keeps them as strings) for a reader."""
    if raw in _EMPTY:
        return NONE
    if model_field.choices:
        return str(dict(model_field.flatchoices).get(raw, raw))
    if model_field.is_relation and model_field.related_model is not None:
        return names.get(model_field.related_model, raw)
    if isinstance(model_field, models.BooleanField):
        return {"True": "yes", "False": "no"}.get(raw, raw)
    if isinstance(model_field, models.DateTimeField):
        moment = parse_datetime(raw)
        return f"{moment:%Y-%m-%d %H:%M}" if moment else raw
    if isinstance(model_field, models.JSONField | models.CharField) and raw[:1] in "[{":
        try:
            parsed = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            return raw
        if isinstance(parsed, list):
            return ", ".join(map(str, parsed)) or NONE
    return raw


def _changes(entry: LogEntry, model: type[models.Model] | None, names: _Names) -> list[str]:
    if entry.action == LogEntry.Action.DELETE or model is None:
        return []
    lines = []
    for name, values in (entry.changes_dict or {}).items():
        try:
            model_field = model._meta.get_field(name)
        except FieldDoesNotExist:
            continue
        # Reverse relations (a tenant's "api_keys") are no field of the row.
        if not model_field.concrete or name in _SKIPPED_FIELDS:
            continue
        old, new = (_value(model_field, str(v), names) for v in values)
        if old == new or (entry.action == LogEntry.Action.CREATE and new == NONE):
            continue
        label = str(model_field.verbose_name)
        if entry.action == LogEntry.Action.CREATE:
            lines.append(f"{label}: {new}")
        else:
            lines.append(f"{label}: {old} → {new}")
    return lines


def audit_lines(entries) -> list[AuditLine]:
    """``entries`` (LogEntry rows, actor and content type selected) worded."""
    names = _Names()
    lines = []
    for entry in entries:
        model = entry.content_type.model_class()
        noun = model._meta.verbose_name if model is not None else entry.content_type.model
        actor = entry.actor.get_username() if entry.actor else "system"
        verb = _VERBS.get(entry.action, "changed")
        lines.append(
            AuditLine(
                when=entry.timestamp,
                actor=actor,
                action=verb,
                model=entry.content_type.model,
                sentence=f"{actor} {verb} the {noun} “{entry.object_repr}”",
                changes=_changes(entry, model, names),
            )
        )
    return lines
