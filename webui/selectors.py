"""Reading what a user owns: their conversations, their keys and their usage; never anyone else's."""
from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.utils import timezone

from openai_api.errors import APIError
from teams.models import APIKey
from teams.selectors import team_for_user, usage_by_day

from .models import Conversation


def conversations_of(user) -> list[Conversation]:
    return list(Conversation.objects.filter(user=user).only("id", "title", "model", "created_at", "updated_at"))


def conversation_of(user, conversation_id: int) -> Conversation:
    """The user's conversation; another user's is a 404, exactly like one that does not exist."""
    conversation = Conversation.objects.filter(user=user, pk=conversation_id).first()
    if conversation is None:
        raise APIError(404, f"No conversation {conversation_id}.", param="id", code="conversation_not_found")
    return conversation


def team_of(user):
    """The user's team (their keys and session requests count against it); 403 when in none."""
    team = team_for_user(user)
    if team is None:
        raise APIError(403, "Your account is in no team yet: ask an administrator to add you to one.",
                       code="no_team")
    return team


def keys_of(user) -> list[APIKey]:
    return list(APIKey.objects.filter(user=user).select_related("team").order_by("-created_at"))


def key_body(key: APIKey) -> dict:
    def iso(value):
        return value.isoformat() if value else None

    expired = key.expires_at is not None and key.expires_at <= timezone.now()
    return {"id": key.id, "name": key.name, "prefix": key.prefix, "team": key.team.name,
            "created_at": iso(key.created_at), "last_used_at": iso(key.last_used_at),
            "expires_at": iso(key.expires_at), "revoked_at": iso(key.revoked_at),
            "active": key.revoked_at is None and not expired}


def usage_per_day(user, days: int) -> list[dict]:
    """The user's requests and tokens per day (their session's and their keys'), oldest first, no gaps."""
    totals: dict[dt.date, dict] = defaultdict(lambda: {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0})
    for row in usage_by_day(days, user=user):
        day = totals[row["day"]]
        for field in ("requests", "prompt_tokens", "completion_tokens"):
            day[field] += row[field] or 0
    today = timezone.now().date()
    return [{"day": (today - dt.timedelta(days=back)).isoformat(), **totals[today - dt.timedelta(days=back)]}
            for back in range(days - 1, -1, -1)]
