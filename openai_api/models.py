"""The API's own rows. Stored Responses (`store: true`): a response, the input items of its turn, and the turns before it.

Each row holds the whole conversation up to its turn (`history`), so `previous_response_id` is
one read, and `INFERENCE_RESPONSES_MAX_BYTES` bounds what a chain can grow to. Rows belong to a
team (another team's id is a 404) and expire after `INFERENCE_RESPONSES_RETENTION_DAYS`.
"""
from __future__ import annotations

from django.db import models

from teams.models import APIKey, Team


class StoredResponse(models.Model):
    QUEUED, IN_PROGRESS, COMPLETED, INCOMPLETE, FAILED, CANCELLED = (
        "queued", "in_progress", "completed", "incomplete", "failed", "cancelled")
    UNFINISHED = (QUEUED, IN_PROGRESS)

    id = models.CharField(primary_key=True, max_length=100)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="responses")
    key = models.ForeignKey(APIKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="responses")
    user_id = models.IntegerField(null=True, blank=True)  # the browser user a session request came from
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    status = models.CharField(max_length=20)
    background = models.BooleanField(default=False)
    request = models.JSONField(help_text="The request body as sent (a background run is started again from it).")
    history = models.JSONField(default=list, help_text="Items of the turns before this one (inputs and outputs).")
    input_items = models.JSONField(default=list, help_text="This turn's input items, each with its id.")
    response = models.JSONField(help_text="The response object as GET returns it.")
    cancel_requested = models.BooleanField(default=False)
    runner = models.CharField(max_length=64, blank=True, help_text="The web process running a background response.")
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["team", "created_at"])]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


# The Batch API's files, batches and lines live beside their code.
from .batches.models import Batch, BatchLine, StoredFile  # noqa: E402,F401
