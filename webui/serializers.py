"""The conversation store's request shapes: every field declared with its bounds, unknown fields rejected."""
from __future__ import annotations

from rest_framework import serializers

from openai_api.serializers.fields import (
    RejectUnknownFieldsMixin,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
)

MAX_MESSAGES = 500
MAX_TEXT = 200_000


class UsageSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    prompt_tokens = StrictIntegerField(min_value=0)
    completion_tokens = StrictIntegerField(min_value=0)
    total_tokens = StrictIntegerField(min_value=0)


class AnswerStatsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """What the page measured for one answer, shown again when the conversation is reopened."""

    tokens_per_second = StrictFloatField(min_value=0, required=False, allow_null=True)
    seconds = StrictFloatField(min_value=0, required=False)
    usage = UsageSerializer(required=False, allow_null=True)
    finish_reason = StrictCharField(max_length=32, required=False, allow_null=True)
    model = StrictCharField(max_length=200, required=False)


class ToolCallFunctionSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = StrictCharField(max_length=200)
    arguments = StrictCharField(max_length=MAX_TEXT, allow_blank=True)


class ToolCallSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    id = StrictCharField(max_length=100)
    type = serializers.ChoiceField(choices=["function"])
    function = ToolCallFunctionSerializer()


class MessageSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """A chat message as the chat API takes it, plus the page's `stats` for assistant answers."""

    role = serializers.ChoiceField(choices=["user", "assistant", "tool"])
    content = StrictCharField(max_length=MAX_TEXT, allow_blank=True, allow_null=True, required=False)
    reasoning_content = StrictCharField(max_length=MAX_TEXT, allow_blank=True, required=False)
    tool_calls = ToolCallSerializer(many=True, required=False, max_length=64)
    tool_call_id = StrictCharField(max_length=100, required=False)
    stats = AnswerStatsSerializer(required=False)


class ConversationOptionsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """The page's settings for a conversation (sent with each turn as the chat API's fields)."""

    temperature = StrictFloatField(min_value=0, max_value=2, required=False, allow_null=True)
    top_p = StrictFloatField(min_value=0, max_value=1, required=False, allow_null=True)
    max_tokens = StrictIntegerField(min_value=1, max_value=1_000_000, required=False, allow_null=True)
    thinking = serializers.ChoiceField(choices=["auto", "on", "off"], required=False)
    tools = StrictCharField(max_length=MAX_TEXT, allow_blank=True, required=False)


class ConversationSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """A whole conversation as the page saves it (PUT), or a part of it (PATCH, e.g. a rename)."""

    title = StrictCharField(max_length=200, allow_blank=False)
    model = StrictCharField(max_length=200, allow_blank=True, required=False, default="")
    system_prompt = StrictCharField(max_length=MAX_TEXT, allow_blank=True, required=False, default="")
    options = ConversationOptionsSerializer(required=False, default=dict)
    messages = MessageSerializer(many=True, required=False, default=list, max_length=MAX_MESSAGES)


def conversation_body(conversation, with_messages: bool = True) -> dict:
    """A conversation as the page reads it."""
    body = {
        "id": conversation.id,
        "title": conversation.title,
        "model": conversation.model,
        "created_at": conversation.created_at.isoformat(),
        "updated_at": conversation.updated_at.isoformat(),
    }
    if with_messages:
        body.update(system_prompt=conversation.system_prompt, options=conversation.options,
                    messages=conversation.messages)
    return body
