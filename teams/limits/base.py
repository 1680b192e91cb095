"""What both limiter backends share: counter names, windows, the ticket and the 429s.

A request is admitted (one request counted per minute, a parallel slot taken, refused if the
minute's tokens or the budget are already spent), then its tokens are reserved once the
worker has counted the prompt (prompt + the most it may generate), then settled to what it
really used. Only limits that exist are counted, so an unlimited team costs nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from protocol import rest_of_context

from ..principal import Scope

MINUTE = 60
DAY = 86_400
# A parallel slot a crashed web process never released frees itself after this long.
LEASE_SECONDS = 3_600

REQUESTS, PARALLEL, TOKENS, BUDGET = "rpm", "parallel", "tpm", "budget"


def window_end(now: float, length: int) -> float:
    return (math.floor(now / length) + 1) * length


def budget_length(scope: Scope) -> int:
    return max(1, scope.budget_period_days) * DAY


def counter_names(scope: Scope, now: float) -> dict[str, str]:
    """The counters this scope's limits need at `now` (fixed windows from the epoch)."""
    minute = math.floor(now / MINUTE)
    names = {}
    if scope.rpm is not None:
        names[REQUESTS] = f"{scope.name}:rpm:{minute}"
    if scope.max_parallel is not None:
        names[PARALLEL] = f"{scope.name}:parallel"
    if scope.tpm is not None:
        names[TOKENS] = f"{scope.name}:tpm:{minute}"
    if scope.token_budget is not None:
        length = budget_length(scope)
        names[BUDGET] = f"{scope.name}:budget:{length}:{math.floor(now / length)}"
    return names


def limit_of(scope: Scope, check: str) -> int | None:
    return {REQUESTS: scope.rpm, PARALLEL: scope.max_parallel, TOKENS: scope.tpm, BUDGET: scope.token_budget}[check]


def reset_at(scope: Scope, check: str, now: float) -> float:
    if check == BUDGET:
        return window_end(now, budget_length(scope))
    if check == PARALLEL:
        return now + 1
    return window_end(now, MINUTE)


@dataclass
class Ticket:
    """One admitted request's hold on its counters, until settled."""

    request_id: str
    scopes: tuple[Scope, ...]
    now: float
    names: dict[str, dict[str, str]]  # scope name -> {check: counter name}
    used: dict[str, dict[str, int]] = field(default_factory=dict)  # scope name -> {check: value after us}
    reserved: int = 0
    settled: bool = False

    @classmethod
    def for_scopes(cls, request_id: str, scopes: tuple[Scope, ...], now: float) -> "Ticket":
        limited = tuple(s for s in scopes if s.limited)
        return cls(request_id, limited, now, {s.name: counter_names(s, now) for s in limited})

    @property
    def empty(self) -> bool:
        return not self.scopes

    @property
    def counts_tokens(self) -> bool:
        return any(TOKENS in names or BUDGET in names for names in self.names.values())


class LimitExceeded(Exception):
    """A 429: `kind` is OpenAI's error type ("requests"/"tokens"), `code` rate_limit_exceeded or insufficient_quota."""

    def __init__(self, scope: Scope, check: str, used: int, now: float, asked: int = 1) -> None:
        limit = limit_of(scope, check)
        self.kind = "requests" if check in (REQUESTS, PARALLEL) else "tokens"
        self.code = "insufficient_quota" if check == BUDGET else "rate_limit_exceeded"
        self.retry_after = max(1, math.ceil(reset_at(scope, check, now) - now))
        what = {REQUESTS: "requests per minute", PARALLEL: "requests in flight at once",
                TOKENS: "tokens per minute", BUDGET: f"tokens per {scope.budget_period_days}-day budget"}[check]
        owner = "this key" if scope.name.startswith("key:") else "your team"
        if asked > limit and check in (TOKENS, BUDGET):
            message = (f"Request too large: it may use {asked} tokens (prompt + max_tokens), more than the limit of "
                       f"{limit} {what} for {owner}. Lower max_tokens or shorten the prompt.")
        else:
            message = (f"Rate limit reached for {what} for {owner}: limit {limit}, used {used}"
                       + (f", requested {asked}" if check in (TOKENS, BUDGET) else "")
                       + f". Please try again in {self.retry_after}s.")
        if check == BUDGET:
            message = message.replace("Rate limit reached", "Quota exceeded")
        super().__init__(message)
        self.message = message


def reservation_size(prompt_tokens: list[int], max_tokens: int | None, n: int, max_model_len: int | None) -> int:
    """The most a job can use: every prompt, plus n completions of at most max_tokens each
    (no max_tokens: the rest of the context after the longest prompt, as the worker generates)."""
    cap = max_tokens if max_tokens is not None else rest_of_context(prompt_tokens, max_model_len)
    return sum(prompt_tokens) + len(prompt_tokens) * n * cap


# A kind (requests, tokens) with no limit still gets its three headers, so every response has
# all six and a client can always parse them as integers: limit and remaining are this (never
# reached: nothing to wait for) and the reset is "0s".
NO_LIMIT_VALUE = 2**31 - 1


def rate_headers(scopes: tuple[Scope, ...], used: dict[str, dict[str, int]], now: float) -> dict[str, str]:
    """OpenAI's six x-ratelimit-* headers: the tightest limit of each kind (requests: rpm;
    tokens: tpm and the budget) over the scopes, given each scope's counters (`used`, as a
    ticket holds them or `peek` reads them)."""
    headers: dict[str, str] = {}
    for kind, checks in (("requests", (REQUESTS,)), ("tokens", (TOKENS, BUDGET))):
        tightest = None
        for scope in scopes:
            for check in checks:
                limit = limit_of(scope, check)
                if limit is None:
                    continue
                remaining = max(0, limit - used.get(scope.name, {}).get(check, 0))
                if tightest is None or remaining < tightest[1]:
                    tightest = (limit, remaining, duration_text(reset_at(scope, check, now) - now))
        limit, remaining, reset = tightest or (NO_LIMIT_VALUE, NO_LIMIT_VALUE, "0s")
        headers[f"x-ratelimit-limit-{kind}"] = str(limit)
        headers[f"x-ratelimit-remaining-{kind}"] = str(remaining)
        headers[f"x-ratelimit-reset-{kind}"] = reset
    return headers


def ticket_headers(ticket: Ticket) -> dict[str, str]:
    """The headers of an admitted request: its counters as admission (and reservation) left them."""
    return rate_headers(ticket.scopes, ticket.used, ticket.now)


def duration_text(seconds: float) -> str:
    """OpenAI's reset format: 1s, 6m0s, 2h3m4s (whole seconds, at least 1s)."""
    seconds = max(1, math.ceil(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"
