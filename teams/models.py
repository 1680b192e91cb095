"""Teams, their members and API keys, the usage ledger, and the database backend's counters.

Limits are plain columns (None: no limit). A key's own limits and model list can only
narrow its team's: admission checks the team's and the key's counters separately.
"""
from __future__ import annotations

import hashlib

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

KEY_PREFIX = "sk-inf-"
VISIBLE_PREFIX_LENGTH = 12
DEFAULT_TEAM_NAME = "default"


def hash_key(raw_key: str) -> str:
    # Keys are 256-bit random secrets, so a fast hash is enough (no dictionary to attack).
    return hashlib.sha256(raw_key.encode()).hexdigest()


def positive_share(value: float) -> None:
    if not value > 0:
        raise ValidationError("A share is a weight above 0 (1: an equal share).")


def _limit(help_text: str) -> models.PositiveIntegerField:
    return models.PositiveIntegerField(null=True, blank=True, help_text=help_text + " Empty: no limit.")


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    allowed_models = models.JSONField(default=list, blank=True,
                              help_text="Model ids this team may use (a JSON list). Empty: every model.")
    rpm = _limit("Requests per minute.")
    tpm = _limit("Tokens per minute (prompt + completion, reserved at admission).")
    max_parallel = _limit("Requests in flight at once.")
    token_budget = _limit("Tokens per budget period.")
    budget_period_days = models.PositiveIntegerField(default=30, help_text="Length of a budget period in days.")
    share = models.FloatField(default=1.0, validators=[positive_share],
                              help_text="The team's weight in the engine's fair share when the box is contended "
                                        "(1: equal; 2: twice the tokens of a team of 1).")
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams", blank=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(share__gt=0), name="team_share_positive")]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    OWNER, MEMBER = "owner", "member"
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships")
    role = models.CharField(max_length=10, choices=[(OWNER, "owner"), (MEMBER, "member")], default=MEMBER)
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class APIKey(models.Model):
    INTERACTIVE, BATCH = "interactive", "batch"
    SERVICE_TIERS = [(INTERACTIVE, "interactive"), (BATCH, "batch")]

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="keys")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="api_keys")
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=VISIBLE_PREFIX_LENGTH, db_index=True, editable=False)
    hashed_key = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    allowed_models = models.JSONField(default=list, blank=True,
                              help_text="Narrows the team's model list (a JSON list). Empty: the team's list.")
    rpm = _limit("Requests per minute, at most the team's.")
    tpm = _limit("Tokens per minute, at most the team's.")
    max_parallel = _limit("Requests in flight at once, at most the team's.")
    manage_models = models.BooleanField(
        default=False, help_text="May load and unload models for every team (/load_model, /unload_model): "
                                 "an operator's key.")
    service_tier = models.CharField(
        max_length=12, choices=SERVICE_TIERS, default=INTERACTIVE,
        help_text="batch: every request of this key runs at batch priority (only in capacity interactive work leaves).")

    # DRF's permission checks read request.user.is_authenticated.
    is_authenticated = True

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class UsageRecord(models.Model):
    """One finished request: what it used and how it ended. Written in batches, off the request path."""

    request_id = models.CharField(max_length=100, db_index=True)
    created_at = models.DateTimeField(db_index=True)
    team = models.ForeignKey(Team, on_delete=models.SET_NULL, null=True, related_name="usage")
    key = models.ForeignKey(APIKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="usage")
    model = models.CharField(max_length=300)
    endpoint = models.CharField(max_length=100)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    time_to_first_token_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    status_code = models.PositiveSmallIntegerField()
    finish_reason = models.CharField(max_length=30, blank=True)
    cancelled = models.BooleanField(default=False)
    error_code = models.CharField(max_length=100, blank=True)
    refused = models.BooleanField(default=False, help_text="Turned away without running (a 4xx: the team's limits, "
                                                           "not allowed, a prompt over the context): not served.")
    tags = models.JSONField(default=dict, blank=True,
                            help_text="The request's own labels: metadata, user, safety_identifier, service_tier.")

    class Meta:
        indexes = [models.Index(fields=["team", "created_at"]), models.Index(fields=["key", "created_at"])]

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class LimitCounter(models.Model):
    """A fixed-window counter of the database limiter (requests or tokens of one scope and window)."""

    name = models.CharField(max_length=200, unique=True)
    value = models.BigIntegerField(default=0)
    expires_at = models.DateTimeField(db_index=True)


class InFlight(models.Model):
    """A request holding a parallel slot of one scope until settled (or its lease runs out)."""

    scope = models.CharField(max_length=100, db_index=True)
    request_id = models.CharField(max_length=100, db_index=True)
    expires_at = models.DateTimeField()
