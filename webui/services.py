"""Changing what a user owns: conversations (saved whole after each turn) and their own keys."""
from __future__ import annotations

from django.core.exceptions import ValidationError

from openai_api.errors import APIError
from teams.models import APIKey
from teams.services import issue_key, revoke_keys

from .models import Conversation
from .selectors import team_of


def create_conversation(user, data: dict) -> Conversation:
    return Conversation.objects.create(user=user, **data)


def update_conversation(conversation: Conversation, data: dict) -> Conversation:
    for field, value in data.items():
        setattr(conversation, field, value)
    conversation.save()
    return conversation


def delete_conversation(conversation: Conversation) -> None:
    conversation.delete()


def issue_own_key(user, name: str, expires_days: float | None = None) -> tuple[APIKey, str]:
    """A key of the user's team, belonging to the user; returns the row and the secret (shown once)."""
    try:
        return issue_key(name, team_of(user), user=user, expires_days=expires_days)
    except ValidationError as exc:
        raise APIError(400, "; ".join(exc.messages), code="invalid_value") from None


def revoke_own_key(user, key_id: int) -> None:
    """Only the user's own key; anyone else's is a 404, as a key that does not exist."""
    if not revoke_keys(APIKey.objects.filter(pk=key_id, user=user)) and not APIKey.objects.filter(
            pk=key_id, user=user).exists():
        raise APIError(404, f"No key {key_id}.", param="id", code="key_not_found")
