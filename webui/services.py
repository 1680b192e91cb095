"""Changing what a user owns: conversations (turn by turn, version-checked) and their own keys."""
from __future__ import annotations

import json

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Sum

from openai_api.errors import APIError
from teams.models import APIKey
from teams.selectors import team_for_user
from teams.services import add_member, default_team, issue_key, revoke_keys

from .models import Conversation
from .selectors import team_of
from .serializers import MAX_MESSAGES


def _sized(user, messages: list, conversation_id: int | None = None) -> int:
    """The messages' stored size; 413 when the user's conversations would pass their bound with them."""
    size = len(json.dumps(messages, ensure_ascii=False).encode())
    limit = settings.INFERENCE.pages.ui_storage_bytes_per_user
    others = (Conversation.objects.filter(user=user).exclude(pk=conversation_id)
              .aggregate(total=Sum("size_bytes"))["total"] or 0)
    if others + size > limit:
        raise APIError(413, f"Your saved conversations would pass {limit // (1024 * 1024)} MB: delete some "
                       "(attachments take most room) and send again.", code="conversation_storage_full")
    return size


def create_conversation(user, data: dict) -> Conversation:
    return Conversation.objects.create(user=user, size_bytes=_sized(user, data.get("messages", [])), **data)


def update_settings(conversation: Conversation, data: dict) -> Conversation:
    """A rename, another model, other settings: never the messages (see `write_turns`)."""
    for field, value in data.items():
        setattr(conversation, field, value)
    conversation.save(update_fields=[*data, "updated_at"])
    return conversation


def write_turns(conversation_id: int, user, version: int, at: int, messages: list) -> Conversation:
    """Replace the messages from `at` on (at = their count: an append) if nobody wrote since `version`.

    A stale writer (another tab, another device) gets 409 and the page re-reads, so no writer
    ever overwrites a turn it has not seen.
    """
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().filter(user=user, pk=conversation_id).first()
        if conversation is None:
            raise APIError(404, f"No conversation {conversation_id}.", param="id", code="conversation_not_found")
        if conversation.version != version:
            raise APIError(409, "This conversation was changed in another tab or device: it has been reloaded.",
                           param="version", code="conversation_changed")
        if at > len(conversation.messages):
            raise APIError(400, f"at ({at}) is past the conversation's {len(conversation.messages)} messages.",
                           param="at", code="invalid_value")
        updated = conversation.messages[:at] + messages
        if len(updated) > MAX_MESSAGES:
            raise APIError(400, f"A conversation keeps at most {MAX_MESSAGES} messages: start a new one.",
                           param="messages", code="too_many_messages")
        conversation.size_bytes = _sized(user, updated, conversation.pk)
        conversation.messages = updated
        conversation.version += 1
        conversation.save()
    return conversation


def join_default_team_if_staff(user) -> None:
    """First run: a superuser or staff member in no team joins the default one, so the pages work at once."""
    if user.is_authenticated and user.is_staff and team_for_user(user) is None:
        add_member(default_team(), user)


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
