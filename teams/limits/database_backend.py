"""The embedded default's limiter: counters in the database, shared by every process that uses it.

Every check-and-count runs in one transaction of conditional UPDATEs (`value <= limit - n`),
so two processes can never both take the last unit: SQLite serialises writers (the settings
start write transactions at once), PostgreSQL locks the row the first UPDATE touches.
Scopes are taken in name order, so concurrent transactions never wait on each other in a cycle.
"""
from __future__ import annotations

from datetime import datetime, timezone

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import F

from ..models import InFlight, LimitCounter
from ..principal import Scope
from .base import (BUDGET, DAY, LEASE_SECONDS, MINUTE, PARALLEL, REQUESTS, TOKENS, LimitExceeded, Ticket,
                   counter_names, limit_of, reset_at)

SWEEP_SECONDS = 300


def _when(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _expiry(scope: Scope, check: str, now: float) -> datetime:
    return _when(reset_at(scope, check, now) + (DAY if check == BUDGET else MINUTE))


def _value(name: str) -> int:
    return LimitCounter.objects.filter(name=name).values_list("value", flat=True).first() or 0


def _add(name: str, amount: int, limit: int, expires_at: datetime) -> tuple[int, bool]:
    """Add `amount` unless that would pass `limit`; (value now, whether added)."""
    LimitCounter.objects.get_or_create(name=name, defaults={"expires_at": expires_at})
    added = LimitCounter.objects.filter(name=name, value__lte=limit - amount).update(value=F("value") + amount)
    return _value(name), bool(added)


class DatabaseLimiter:
    def __init__(self) -> None:
        self._last_sweep = 0.0

    async def admit(self, ticket: Ticket) -> None:
        await sync_to_async(self._admit, thread_sensitive=False)(ticket)

    async def reserve(self, ticket: Ticket, tokens: int) -> None:
        await sync_to_async(self._reserve, thread_sensitive=False)(ticket, tokens)

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        await sync_to_async(self._settle, thread_sensitive=False)(ticket, used_tokens)

    async def peek(self, scopes: tuple[Scope, ...], now: float) -> dict[str, dict[str, int]]:
        return await sync_to_async(self._peek, thread_sensitive=False)(scopes, now)

    def _admit(self, ticket: Ticket) -> None:
        self._maybe_sweep(ticket.now)
        now = ticket.now
        with transaction.atomic():
            for scope in sorted(ticket.scopes, key=lambda s: s.name):
                names, used = ticket.names[scope.name], ticket.used.setdefault(scope.name, {})
                if REQUESTS in names:
                    used[REQUESTS], added = _add(names[REQUESTS], 1, scope.rpm, _expiry(scope, REQUESTS, now))
                    if not added:
                        raise LimitExceeded(scope, REQUESTS, used[REQUESTS], now)
                if PARALLEL in names:
                    used[PARALLEL] = self._take_slot(scope, names[PARALLEL], ticket)
                for check in (TOKENS, BUDGET):
                    if check in names:
                        used[check] = _value(names[check])
                        if used[check] >= limit_of(scope, check):
                            raise LimitExceeded(scope, check, used[check], now)

    def _take_slot(self, scope: Scope, lock_name: str, ticket: Ticket) -> int:
        now = _when(ticket.now)
        LimitCounter.objects.get_or_create(name=lock_name, defaults={"expires_at": _when(ticket.now + LEASE_SECONDS)})
        LimitCounter.objects.filter(name=lock_name).update(value=F("value") + 1)  # locks the scope's slots
        InFlight.objects.filter(scope=scope.name, expires_at__lt=now).delete()
        in_flight = InFlight.objects.filter(scope=scope.name).count()
        if in_flight >= scope.max_parallel:
            raise LimitExceeded(scope, PARALLEL, in_flight, ticket.now)
        InFlight.objects.create(scope=scope.name, request_id=ticket.request_id,
                                expires_at=_when(ticket.now + LEASE_SECONDS))
        return in_flight + 1

    def _reserve(self, ticket: Ticket, tokens: int) -> None:
        with transaction.atomic():
            for scope in sorted(ticket.scopes, key=lambda s: s.name):
                names, used = ticket.names[scope.name], ticket.used.setdefault(scope.name, {})
                for check in (TOKENS, BUDGET):
                    if check in names:
                        value, added = _add(names[check], tokens, limit_of(scope, check),
                                            _expiry(scope, check, ticket.now))
                        if not added:
                            raise LimitExceeded(scope, check, value, ticket.now, asked=tokens)
                        used[check] = value
        ticket.reserved = tokens

    def _settle(self, ticket: Ticket, used_tokens: int) -> None:
        refund = ticket.reserved - used_tokens
        with transaction.atomic():
            for scope in sorted(ticket.scopes, key=lambda s: s.name):
                for check in (TOKENS, BUDGET):
                    name = ticket.names[scope.name].get(check)
                    if name and refund:
                        LimitCounter.objects.filter(name=name).update(value=F("value") - refund)
            InFlight.objects.filter(request_id=ticket.request_id).delete()

    def _peek(self, scopes: tuple[Scope, ...], now: float) -> dict[str, dict[str, int]]:
        result = {}
        for scope in scopes:
            names = counter_names(scope, now)
            values = {check: _value(name) for check, name in names.items() if check != PARALLEL}
            if PARALLEL in names:
                values[PARALLEL] = InFlight.objects.filter(scope=scope.name, expires_at__gte=_when(now)).count()
            result[scope.name] = values
        return result

    def _maybe_sweep(self, now: float) -> None:
        if now - self._last_sweep < SWEEP_SECONDS:
            return
        self._last_sweep = now
        LimitCounter.objects.filter(expires_at__lt=_when(now)).delete()
        InFlight.objects.filter(expires_at__lt=_when(now)).delete()
