"""Changing conversations (the page saves the whole conversation after each turn)."""
from __future__ import annotations

from .models import Conversation


def create_conversation(user, data: dict) -> Conversation:
    return Conversation.objects.create(user=user, **data)


def update_conversation(conversation: Conversation, data: dict) -> Conversation:
    for field, value in data.items():
        setattr(conversation, field, value)
    conversation.save()
    return conversation


def delete_conversation(conversation: Conversation) -> None:
    conversation.delete()
