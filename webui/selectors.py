"""Reading conversations: a user only ever sees their own."""
from __future__ import annotations

from openai_api.errors import APIError

from .models import Conversation


def conversations_of(user) -> list[Conversation]:
    return list(Conversation.objects.filter(user=user).only("id", "title", "model", "created_at", "updated_at"))


def conversation_of(user, conversation_id: int) -> Conversation:
    """The user's conversation; another user's is a 404, exactly like one that does not exist."""
    conversation = Conversation.objects.filter(user=user, pk=conversation_id).first()
    if conversation is None:
        raise APIError(404, f"No conversation {conversation_id}.", param="id", code="conversation_not_found")
    return conversation
