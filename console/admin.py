from django.contrib import admin

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
