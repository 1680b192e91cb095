"""The Batch API's batches and files in Django's admin, read-only: the runner and the API change them."""
from __future__ import annotations

from django.contrib import admin

from .batches.models import Batch, StoredFile


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdmin):
    list_display = ("id", "team", "endpoint", "status", "total", "completed", "failed", "created_at", "runner")
    list_filter = ("status", "endpoint", "team")
    search_fields = ("id",)


@admin.register(StoredFile)
class StoredFileAdmin(ReadOnlyAdmin):
    list_display = ("id", "team", "purpose", "filename", "bytes", "created_at")
    list_filter = ("purpose", "team")
    search_fields = ("id", "filename")
