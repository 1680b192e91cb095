"""Reading teams, keys and usage: principals for requests, `/v1/key`'s status, the admin's report."""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

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


def open_to_every_team(repo_id: str) -> bool:
    """No team's model list leaves the model out: what may be told about it to a caller without a key."""
    return all(not allowed or repo_id in allowed for allowed in Team.objects.values_list("allowed_models", flat=True))


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


def usage_totals(since: dt.datetime, exclude_request_ids: Iterable[str] = (), **filters) -> dict[str, int]:
    """{requests (served), refused, prompt_tokens, completion_tokens} of the ledger's rows since `since`
    (rows of `exclude_request_ids` left out: the caller counts those itself)."""
    rows = UsageRecord.objects.filter(created_at__gte=since, **filters)
    excluded = list(exclude_request_ids)
    if excluded:
        rows = rows.exclude(request_id__in=excluded)
    totals = rows.aggregate(
        requests=Count("id", filter=Q(refused=False)), refused=Count("id", filter=Q(refused=True)),
        prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"))
    return {name: value or 0 for name, value in totals.items()}


def written_request_ids(request_ids: Iterable[str]) -> set[str]:
    """Which of these requests' ledger rows are in the database already."""
    ids = list(request_ids)
    if not ids:
        return set()
    return set(UsageRecord.objects.filter(request_id__in=ids).values_list("request_id", flat=True))


def usage_by_team(since: dt.datetime) -> list[dict]:
    """Per team since `since`: {team, share, requests (served), refused, tokens, token_share, weight_share}.

    `token_share` is the team's part of every team's tokens in the window, `weight_share` its share
    weight's part of the weights of the teams listed (what fair share gives them when all are busy)."""
    rows = list(
        UsageRecord.objects.filter(created_at__gte=since, team__isnull=False)
        .values("team__name", "team__share")
        .annotate(requests=Count("id", filter=Q(refused=False)), refused=Count("id", filter=Q(refused=True)),
                  prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"))
        .order_by("team__name"))
    total_tokens = sum((r["prompt_tokens"] or 0) + (r["completion_tokens"] or 0) for r in rows)
    total_weight = sum(r["team__share"] for r in rows)
    report = []
    for row in rows:
        tokens = (row["prompt_tokens"] or 0) + (row["completion_tokens"] or 0)
        report.append({"team": row["team__name"], "share": row["team__share"], "requests": row["requests"],
                       "refused": row["refused"], "tokens": tokens,
                       "token_share": tokens / total_tokens if total_tokens else 0.0,
                       "weight_share": row["team__share"] / total_weight if total_weight else 0.0})
    return report


def usage_by_day(days: int = 30, **filters) -> list[dict]:
    """Rows of {day, team, key, model, requests (served), refused, prompt_tokens, completion_tokens}
    for the admin report."""
    since = timezone.now() - dt.timedelta(days=days)
    return list(
        UsageRecord.objects.filter(created_at__gte=since, **filters)
        .annotate(day=TruncDate("created_at"))
        .values("day", "team__name", "key__name", "key__prefix", "model")
        .annotate(requests=Count("id", filter=Q(refused=False)), refused=Count("id", filter=Q(refused=True)),
                  prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"))
        .order_by("day", "team__name", "key__name", "model")
    )
