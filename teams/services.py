"""Changing teams and keys: creating them, issuing and revoking secrets, the local bootstrap key."""
from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from .models import DEFAULT_TEAM_NAME, KEY_PREFIX, VISIBLE_PREFIX_LENGTH, APIKey, Membership, Team, hash_key

LIMIT_FIELDS = ("rpm", "tpm", "max_parallel")


def default_team() -> Team:
    """The team with no limits that keys made without a team (and `serve`'s own key) belong to."""
    team, _ = Team.objects.get_or_create(name=DEFAULT_TEAM_NAME)
    return team


def create_team(name: str, *, allowed_models: list[str] | None = None, rpm: int | None = None,
                tpm: int | None = None, max_parallel: int | None = None, token_budget: int | None = None,
                budget_period_days: int = 30, share: float = 1.0) -> Team:
    team = Team(name=name, allowed_models=list(allowed_models or []), rpm=rpm, tpm=tpm, max_parallel=max_parallel,
                token_budget=token_budget, budget_period_days=budget_period_days, share=share)
    team.full_clean()
    team.save()
    return team


def add_member(team: Team, user, role: str = Membership.MEMBER) -> Membership:
    membership, _ = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return membership


def member_keys(team: Team, user):
    """The user's keys in the team that still work (not revoked; expired ones are left alone)."""
    return APIKey.objects.filter(team=team, user=user, revoked_at__isnull=True)


@transaction.atomic
def remove_member(team: Team, user, revoke_keys_too: bool = False) -> bool:
    """Take the user out of the team; False when they were not in it (nothing to do).

    A key belongs to a member of its team, so the user's unrevoked keys in the team must go first:
    revoked here when `revoke_keys_too`, else a ValidationError naming them."""
    membership = Membership.objects.filter(team=team, user=user).first()
    if membership is None:
        return False
    keys = member_keys(team, user)
    if keys.exists():
        if not revoke_keys_too:
            names = ", ".join(f"{key.name} ({key.prefix}…)" for key in keys)
            raise ValidationError({"user": f"{user} holds keys in team {team.name}: {names}. Revoke them first "
                                           "(or remove with --revoke-keys)."})
        revoke_keys(keys)
    membership.delete()
    return True


def check_narrows(team: Team, allowed_models: list[str], limits: dict[str, int | None]) -> None:
    """A key may only narrow its team: its models within the team's list, its limits at most the team's."""
    errors = {}
    if team.allowed_models and allowed_models:
        outside = sorted(set(allowed_models) - set(team.allowed_models))
        if outside:
            errors["allowed_models"] = f"Not in team {team.name}'s models: {', '.join(outside)}."
    for field in LIMIT_FIELDS:
        mine, theirs = limits.get(field), getattr(team, field)
        if mine is not None and theirs is not None and mine > theirs:
            errors[field] = f"At most the team's limit ({theirs})."
    if errors:
        raise ValidationError(errors)


def check_member(team: Team, user) -> None:
    if user is not None and not Membership.objects.filter(team=team, user=user).exists():
        raise ValidationError({"user": f"{user} is not a member of team {team.name}."})


def new_secret() -> tuple[str, str, str]:
    """(raw secret, visible prefix, hash): the raw secret is shown once and never stored."""
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    return raw_key, raw_key[:VISIBLE_PREFIX_LENGTH], hash_key(raw_key)


def issue_key(name: str, team: Team | None = None, *, user=None, allowed_models: list[str] | None = None,
              rpm: int | None = None, tpm: int | None = None, max_parallel: int | None = None,
              expires_days: float | None = None, manage_models: bool = False,
              service_tier: str = APIKey.INTERACTIVE) -> tuple[APIKey, str]:
    """Create a key; returns the row and the raw secret."""
    team = team or default_team()
    limits = {"rpm": rpm, "tpm": tpm, "max_parallel": max_parallel}
    check_narrows(team, list(allowed_models or []), limits)
    check_member(team, user)
    if service_tier not in dict(APIKey.SERVICE_TIERS):
        raise ValidationError({"service_tier": f"One of {', '.join(dict(APIKey.SERVICE_TIERS))}."})
    raw_key, prefix, hashed = new_secret()
    expires_at = timezone.now() + timedelta(days=expires_days) if expires_days is not None else None
    key = APIKey.objects.create(team=team, user=user, name=name, prefix=prefix, hashed_key=hashed,
                                allowed_models=list(allowed_models or []), expires_at=expires_at,
                                manage_models=manage_models, service_tier=service_tier, **limits)
    return key, raw_key


def revoke_keys(keys) -> int:
    """Revoked keys fail from their very next request (every request looks its key up)."""
    return keys.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


TOUCH_EVERY_SECONDS = 60


def touch_due(key: APIKey) -> bool:
    """Whether the key's use is to be recorded now: at most once a minute per key (a write on every
    request would queue on SQLite)."""
    return key.last_used_at is None or timezone.now() - key.last_used_at > timedelta(seconds=TOUCH_EVERY_SECONDS)


def touch_key(key: APIKey) -> None:
    if touch_due(key):
        APIKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())


def key_file_path(port: int) -> Path:
    """Per-port, so a client of http://127.0.0.1:PORT finds the key of the server on PORT."""
    return settings.INFERENCE.teams.key_dir / f"{port}.key"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
    os.chmod(path, 0o600)


MIN_GIVEN_KEY_LENGTH = 16


def adopt_key(raw_key: str, name: str) -> APIKey:
    """A key the operator chose (`serve --auth-token/--auth-token-file`, forgather's) as a default-team key that
    may manage models: the existing row with this secret if it is still usable, else a new one."""
    from .selectors import usable_key

    if len(raw_key) < MIN_GIVEN_KEY_LENGTH or any(c.isspace() for c in raw_key):
        raise ValidationError(f"A given API key needs at least {MIN_GIVEN_KEY_LENGTH} characters and no spaces.")
    existing = usable_key(raw_key)
    if existing is not None:
        return existing
    return APIKey.objects.create(team=default_team(), name=name, prefix=raw_key[:VISIBLE_PREFIX_LENGTH],
                                 hashed_key=hash_key(raw_key), manage_models=True)


@transaction.atomic
def ensure_local_key(port: int) -> tuple[str, Path, bool]:
    """The key in this port's key file if it is still usable, else a new default-team key written there.

    Returns (raw key, file path, whether it was created now).
    """
    from .selectors import usable_key

    path = key_file_path(port)
    if path.exists():
        raw_key = path.read_text().strip()
        if usable_key(raw_key) is not None:
            return raw_key, path, False
    _, raw_key = issue_key(f"local serve :{port}", manage_models=True)  # the operator's own key
    _write_private(path, raw_key)
    return raw_key, path, True
