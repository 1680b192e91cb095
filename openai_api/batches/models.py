"""The Batch API's rows: stored files, batches and their lines (the state a restart resumes from)."""
from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


class StoredFile(models.Model):
    """An uploaded (or produced) file: the row here, the bytes under INFERENCE_BATCH_FILES_DIR."""

    BATCH, BATCH_OUTPUT = "batch", "batch_output"
    id = models.CharField(primary_key=True, max_length=40, editable=False)
    team = models.ForeignKey("teams.Team", on_delete=models.CASCADE, related_name="files")
    purpose = models.CharField(max_length=20)
    filename = models.CharField(max_length=255)
    bytes = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["team", "created_at"])]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class Batch(models.Model):
    """One batch: its status, counts, files, and which process runs it (runner, heartbeat_at)."""

    VALIDATING, FAILED, IN_PROGRESS, FINALIZING = "validating", "failed", "in_progress", "finalizing"
    COMPLETED, EXPIRED, CANCELLING, CANCELLED = "completed", "expired", "cancelling", "cancelled"
    ACTIVE = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)
    id = models.CharField(primary_key=True, max_length=40, editable=False)
    team = models.ForeignKey("teams.Team", on_delete=models.CASCADE, related_name="batches")
    key = models.ForeignKey("teams.APIKey", on_delete=models.SET_NULL, null=True, blank=True, related_name="batches")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="batches")
    endpoint = models.CharField(max_length=40)
    completion_window = models.CharField(max_length=10, default="24h")
    input_file = models.ForeignKey(StoredFile, on_delete=models.SET_NULL, null=True, related_name="+")
    output_file = models.ForeignKey(StoredFile, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    error_file = models.ForeignKey(StoredFile, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    status = models.CharField(max_length=12, default=VALIDATING, db_index=True)
    errors = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(null=True, blank=True)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    runner = models.CharField(max_length=100, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "batches"
        indexes = [models.Index(fields=["team", "created_at"])]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class BatchLine(models.Model):
    """One request of a batch; `result` is its output line once run (never run again after that)."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    index = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=512)
    body = models.JSONField()
    done = models.BooleanField(default=False)
    is_error = models.BooleanField(default=False)
    result = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["batch", "index"], name="one_line_per_index")]
        indexes = [models.Index(fields=["batch", "done", "index"])]
