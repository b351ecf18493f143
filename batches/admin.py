"""Staff inspect files and batches; changes go through the API, the console
or ``manage.py batches`` (a status edited here would bypass the feeders)."""

from django.contrib import admin

from batches.models import Batch, File


@admin.register(File)
class FileAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "purpose", "filename", "bytes", "created_at"]
    list_filter = ["purpose"]
    search_fields = ["id", "filename", "tenant__name"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "tenant",
        "endpoint",
        "status",
        "total",
        "completed",
        "failed",
        "enqueued_tokens",
        "created_at",
    ]
    list_filter = ["status", "endpoint"]
    search_fields = ["id", "tenant__name"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return False
