"""Reading teams, keys and usage: principals for requests, `/v1/key`'s status, the admin's report."""
from __future__ import annotations

import datetime as dt

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from .models import APIKey, Membership, Team, UsageRecord, hash_key
from .principal import Principal


def usable_key(raw_key: str) -> APIKey | None:
    """The key with this secret, unless revoked or expired (compared by hash; checked on every request)."""
    now = timezone.now()
    return (APIKey.objects.select_related("team", "user")
            .filter(hashed_key=hash_key(raw_key), revoked_at__isnull=True)
            .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
            .first())


def principal_for_key(key: APIKey) -> Principal:
    return Principal.of(key.team, key.user, key)


def team_for_user(user) -> Team | None:
    """A signed-in user's team: the one they own, else the one they joined first."""
    membership = (Membership.objects.select_related("team").filter(user=user)
                  .order_by("-role", "joined_at").first())  # "owner" sorts after "member": descending
    return membership.team if membership else None


def principal_for_user(user) -> Principal | None:
    """A browser session's principal (no key): counted against the user's team like a key, or None."""
    if user is None or not user.is_authenticated:
        return None
    team = team_for_user(user)
    return Principal.of(team, user, None) if team else None


def usage_totals(since: dt.datetime, **filters) -> dict[str, int]:
    totals = UsageRecord.objects.filter(created_at__gte=since, **filters).aggregate(
        requests=Count("id"), prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"))
    return {name: value or 0 for name, value in totals.items()}


def usage_by_day(days: int = 30, **filters) -> list[dict]:
    """Rows of {day, team, key, model, requests, prompt_tokens, completion_tokens} for the admin report."""
    since = timezone.now() - dt.timedelta(days=days)
    return list(
        UsageRecord.objects.filter(created_at__gte=since, **filters)
        .annotate(day=TruncDate("created_at"))
        .values("day", "team__name", "key__name", "key__prefix", "model")
        .annotate(requests=Count("id"), prompt_tokens=Sum("prompt_tokens"),
                  completion_tokens=Sum("completion_tokens"))
        .order_by("day", "team__name", "key__name", "model")
    )
