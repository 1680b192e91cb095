"""What a principal may use and has left: `GET /v1/key`, and the browser's account page.

OpenRouter's key shape (`label`, `limit`, `usage`, `limit_remaining`, `rate_limit`) with the
team, the model list, every limit and what is left of each now. The period's requests and tokens
are the ledger's rows plus those settled but not yet written (teams/pending_usage.py), so a
response's usage shows the moment it ends; refused requests are counted apart.
"""
from __future__ import annotations

import datetime as dt
import time

from asgiref.sync import sync_to_async

from .limits import limiter
from .limits.base import BUDGET, PARALLEL, REQUESTS, TOKENS, budget_length, reset_at
from .principal import Principal
from .ledger import LedgerWriter
from .selectors import usage_totals, written_request_ids


def _left(used: dict[str, int], check: str, limit: int | None) -> int | None:
    return None if limit is None else max(0, limit - used.get(check, 0))


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc).isoformat()


def _period_usage(team_id: int, since: dt.datetime, pending_ids: list[str]) -> tuple[dict[str, int], set[str]]:
    """The database's totals without the pending rows, and which pending rows it holds already."""
    return usage_totals(since, exclude_request_ids=pending_ids, team_id=team_id), written_request_ids(pending_ids)


async def period_usage(team_id: int, period_start: float) -> dict[str, int]:
    """{requests (served), refused, prompt_tokens, completion_tokens} of the team since `period_start`:
    the ledger's rows and the pending ones, each counted once (pending first, then the database
    without them: a batch committing between the two reads is still counted once)."""
    store = LedgerWriter.get().pending
    pending = [row for row in await store.of_team(team_id) if row.created_at >= period_start]
    ids = [row.request_id for row in pending]
    since = dt.datetime.fromtimestamp(period_start, tz=dt.timezone.utc)
    spent, written = await sync_to_async(_period_usage, thread_sensitive=False)(team_id, since, ids)
    for row in pending:
        spent["refused" if row.refused else "requests"] += 1
        spent["prompt_tokens"] += row.prompt_tokens
        spent["completion_tokens"] += row.completion_tokens
    if written:
        await store.forget(team_id, written)  # committed: every later read counts them from the database
    return spent


async def quota_status(principal: Principal) -> dict:
    now = time.time()
    counts = await limiter().peek(principal.scopes, now)
    team_scope = principal.scopes[0]
    period_start = (reset_at(team_scope, BUDGET, now) - budget_length(team_scope))
    key = principal.key
    spent = await period_usage(principal.team.pk, period_start)
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
        "refused_requests": spent["refused"],
        "is_free_tier": False,
        "share": principal.team.share,
        "service_tier": key.service_tier if key else "interactive",
        "rate_limit": scopes,
    }}
