"""API keys: the secret is shown once and stored only as a hash."""
from __future__ import annotations

import hashlib
import secrets

from django.db import models

KEY_PREFIX = "sk-inf-"
VISIBLE_PREFIX_LENGTH = 12


def hash_key(raw_key: str) -> str:
    # Keys are 256-bit random secrets, so a fast hash is enough (no dictionary to attack).
    return hashlib.sha256(raw_key.encode()).hexdigest()


class APIKey(models.Model):
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=VISIBLE_PREFIX_LENGTH, db_index=True, editable=False)
    hashed_key = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked = models.BooleanField(default=False)

    # DRF treats request.user as the authenticated principal.
    is_authenticated = True

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, name: str) -> tuple["APIKey", str]:
        """Create a key; returns the row and the raw secret, which is never stored."""
        raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
        key = cls.objects.create(name=name, prefix=raw_key[:VISIBLE_PREFIX_LENGTH], hashed_key=hash_key(raw_key))
        return key, raw_key
