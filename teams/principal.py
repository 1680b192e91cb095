"""Who a request is counted against: a team, and within it maybe a user and maybe a key.

Bearer keys give (team, key.user, key); a signed-in browser user gives (team, user, None).
Admission, limits and the ledger take a Principal and never ask which kind it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .models import APIKey, Team


@dataclass(frozen=True)
class Scope:
    """One set of counters and the limits on them (None: unlimited)."""

    name: str
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    token_budget: int | None = None
    budget_period_days: int = 30

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.rpm, self.tpm, self.max_parallel, self.token_budget))


@dataclass(frozen=True)
class Principal:
    team: Team
    user: object | None = None  # a Django user, or None
    key: APIKey | None = None
    scopes: tuple[Scope, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, team: Team, user=None, key: APIKey | None = None) -> "Principal":
        scopes = [Scope(f"team:{team.pk}", team.rpm, team.tpm, team.max_parallel, team.token_budget,
                        team.budget_period_days or 30)]
        if key is not None:
            scopes.append(Scope(f"key:{key.pk}", key.rpm, key.tpm, key.max_parallel))
        return cls(team, user, key, tuple(scopes))

    @property
    def allowed_models(self) -> frozenset[str] | None:
        """The repo ids this principal may use; None: every model."""
        lists = [set(m) for m in (self.team.allowed_models, self.key.allowed_models if self.key else None) if m]
        if not lists:
            return None
        return frozenset(set.intersection(*lists))

    def may_use(self, repo_id: str) -> bool:
        allowed = self.allowed_models
        return allowed is None or repo_id.split("@", 1)[0] in allowed

    @property
    def may_manage_models(self) -> bool:
        """Loading and unloading change what every team gets: admin users and `manage_models` keys only."""
        if self.key is not None:
            return self.key.manage_models
        return bool(getattr(self.user, "is_staff", False) or getattr(self.user, "is_superuser", False))

    @property
    def label(self) -> str:
        """For logs and `requested_by`: never the secret."""
        who = self.key.prefix + "…" if self.key else getattr(self.user, "username", None) or "anonymous"
        return f"{self.team.name}/{who}"
