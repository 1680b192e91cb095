"""What a principal may use and has left: `GET /v1/key`, and the browser's account page.

OpenRouter's key shape (`label`, `limit`, `usage`, `limit_remaining`, `rate_limit`) with the
team, the model list, every limit and what is left of each now.
"""
from __future__ import annotations

import datetime as dt
import time

from asgiref.sync import sync_to_async

from .limits import limiter
from .limits.base import BUDGET, PARALLEL, REQUESTS, TOKENS, budget_length, reset_at
from .principal import Principal
from .selectors import usage_totals


def _left(used: dict[str, int], check: str, limit: int | None) -> int | None:
    return None if limit is None else max(0, limit - used.get(check, 0))


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc).isoformat()


async def quota_status(principal: Principal) -> dict:
    now = time.time()
    counts = await limiter().peek(principal.scopes, now)
    team_scope = principal.scopes[0]
    period_start = (reset_at(team_scope, BUDGET, now) - budget_length(team_scope))
    key = principal.key
    spent = await sync_to_async(usage_totals, thread_sensitive=False)(
        dt.datetime.fromtimestamp(period_start, tz=dt.timezone.utc), team=principal.team)
    team_used = counts.get(team_scope.name, {})
    budget = team_scope.token_budget
    usage = team_used.get(BUDGET, 0) if budget is not None else spent["prompt_tokens"] + spent["completion_tokens"]
    scopes = []
    for scope in principal.scopes:
        used = counts.get(scope.name, {})
        scopes.append({
            "scope": "key" if scope.name.startswith("key:") else "team",
            "requests_per_minute": scope.rpm, "tokens_per_minute": scope.tpm,
            "max_parallel_requests": scope.max_parallel,
            "remaining_requests": _left(used, REQUESTS, scope.rpm),
            "remaining_tokens": _left(used, TOKENS, scope.tpm),
            "in_flight": used.get(PARALLEL) if scope.max_parallel is not None else None,
        })
    allowed = principal.allowed_models
    return {"data": {
        "label": f"{key.prefix}…" if key else None,
        "name": key.name if key else None,
        "team": principal.team.name,
        "user": getattr(principal.user, "username", None),
        "models": sorted(allowed) if allowed is not None else None,
        "expires_at": key.expires_at.isoformat() if key and key.expires_at else None,
        "limit": budget,
        "limit_period_days": team_scope.budget_period_days,
        "limit_reset": _iso(reset_at(team_scope, BUDGET, now)),
        "usage": usage,
        "limit_remaining": None if budget is None else max(0, budget - usage),
        "period_requests": spent["requests"],
        "is_free_tier": False,
        "rate_limit": scopes,
    }}
