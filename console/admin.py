from auditlog.admin import LogEntryAdmin
from auditlog.models import LogEntry
from django.contrib import admin
from django.utils.html import format_html, format_html_join

from console.audit import audit_lines
from console.models import Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "status", "content", "model", "completion_tokens", "superseded")
    readonly_fields = fields


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "user", "tenant", "model", "updated_at")
    list_filter = ("tenant",)
    search_fields = ("title", "user__username")
    inlines = [MessageInline]


class WordedLogEntryAdmin(LogEntryAdmin):
    """auditlog's admin, with each entry worded as on the console's Audit page
    (names, not ids; no rows for fields that did not change)."""

    list_display = ["created", "summary", "user_url"]
    readonly_fields = [*LogEntryAdmin.readonly_fields, "summary"]
    fieldsets = [(None, {"fields": ["created", "user_url", "resource_url", "cid", "summary"]})]

    @admin.display(description="What happened")
    def summary(self, obj):
        line = audit_lines([obj])[0]
        changes = format_html_join("", "<li>{}</li>", ((c,) for c in line.changes))
        return format_html("{}<ul>{}</ul>", line.sentence, changes)


admin.site.unregister(LogEntry)
admin.site.register(LogEntry, WordedLogEntryAdmin)
