"""Chat conversations kept on the server, so they follow their user from browser to browser."""
from __future__ import annotations

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    """One chat: its settings and its messages (a JSON list in the chat API's message shape)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200)
    model = models.CharField(max_length=200, blank=True)
    system_prompt = models.TextField(blank=True)
    # Sampling and display settings the page sends with each turn (temperature, top_p, max_tokens…).
    options = models.JSONField(default=dict, blank=True)
    messages = models.JSONField(default=list, blank=True)
    # Bumped by every write of the messages: a write names the version it saw, so two tabs or
    # devices never overwrite each other's turns (a stale one gets 409 and re-reads).
    version = models.PositiveIntegerField(default=0)
    # The stored JSON's size, for the per-user bound on what the store keeps (attachments included).
    size_bytes = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        indexes = [models.Index(fields=["user", "-updated_at"])]

    def __str__(self) -> str:
        return self.title
