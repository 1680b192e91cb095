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
MAX_VERSIONS = 50
MAX_PARTS = 32
MAX_MEDIA_URL = 8 * 1024 * 1024  # one attachment's data URL (the page shrinks big images before)
MEDIA_PARTS = {"image_url": "image/", "video_url": "video/"}


class ContentField(serializers.Field):
    """A message's content as the chat API takes it: text, null, or a list of text and media parts.

    Media are kept as data URLs (stored with the conversation, so a retry sends them again and
    deleting the conversation deletes them); an http(s) URL is refused, the store fetches nothing.
    """

    default_error_messages = {"invalid": "content must be a string, null or a list of content parts."}

    def __init__(self, **kwargs):
        kwargs.setdefault("allow_null", True)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, str):
            if len(data) > MAX_TEXT:
                raise serializers.ValidationError(f"Ensure this field has no more than {MAX_TEXT} characters.")
            return data
        if not isinstance(data, list) or len(data) > MAX_PARTS:
            self.fail("invalid")
        return [self._part(part, index) for index, part in enumerate(data)]

    def _part(self, part, index: int) -> dict:
        def problem(message: str):
            return serializers.ValidationError(f"[{index}]: {message}")

        if not isinstance(part, dict):
            raise problem("a content part must be an object.")
        kind = part.get("type")
        if kind == "text":
            if set(part) != {"type", "text"} or not isinstance(part["text"], str) or len(part["text"]) > MAX_TEXT:
                raise problem('a text part is {"type": "text", "text": "..."}.')
            return part
        if kind in MEDIA_PARTS:
            spec = part.get(kind)
            url = spec.get("url") if isinstance(spec, dict) else None
            if (set(part) - {"type", kind, "name"} or not isinstance(url, str) or set(spec) - {"url", "detail"}
                    or not url.startswith(f"data:{MEDIA_PARTS[kind]}") or ";base64," not in url[:100]):
                raise problem(f'{kind} must be {{"url": "data:{MEDIA_PARTS[kind]}...;base64,..."}}.')
            if len(url) > MAX_MEDIA_URL:
                raise problem(f"an attachment may be at most {MAX_MEDIA_URL // (1024 * 1024)} MB as a data URL.")
            return part
        if kind == "input_audio":
            spec = part.get("input_audio")
            if (set(part) - {"type", "input_audio", "name"} or not isinstance(spec, dict)
                    or set(spec) != {"data", "format"} or spec["format"] not in ("wav", "mp3")
                    or not isinstance(spec["data"], str)):
                raise problem('input_audio must be {"data": "<base64>", "format": "wav" | "mp3"}.')
            if len(spec["data"]) > MAX_MEDIA_URL:
                raise problem(f"an attachment may be at most {MAX_MEDIA_URL // (1024 * 1024)} MB.")
            return part
        raise problem("type must be text, image_url, input_audio or video_url.")

    def to_representation(self, value):
        return value


class PromptTokensDetailsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    cached_tokens = StrictIntegerField(min_value=0, required=False)


class UsageSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """An answer's `usage` as the API gave it (OpenAI's shape)."""

    prompt_tokens = StrictIntegerField(min_value=0)
    completion_tokens = StrictIntegerField(min_value=0)
    total_tokens = StrictIntegerField(min_value=0)
    prompt_tokens_details = PromptTokensDetailsSerializer(required=False, allow_null=True)


class AnswerStatsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """What the page measured for one answer, shown again when the conversation is reopened."""

    tokens_per_second = StrictFloatField(min_value=0, required=False, allow_null=True)
    seconds = StrictFloatField(min_value=0, required=False)
    usage = UsageSerializer(required=False, allow_null=True)
    finish_reason = StrictCharField(max_length=32, required=False, allow_null=True)
    model = StrictCharField(max_length=200, required=False)
    # The messages this answer's request left out (the chat's Context overflow): [from, to) index ranges.
    not_sent = serializers.ListField(
        child=serializers.ListField(child=StrictIntegerField(min_value=0, max_value=MAX_MESSAGES), min_length=2,
                                    max_length=2),
        max_length=MAX_MESSAGES, required=False)


class ToolCallFunctionSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = StrictCharField(max_length=200)
    arguments = StrictCharField(max_length=MAX_TEXT, allow_blank=True)


class ToolCallSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    id = StrictCharField(max_length=100)
    type = serializers.ChoiceField(choices=["function"])
    function = ToolCallFunctionSerializer()


class MessageSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """A chat message as the chat API takes it, plus the page's `stats` for assistant answers."""

    # The page's own id for a message, so a turn written twice (a retried save) is recognised.
    id = StrictCharField(max_length=64, required=False)
    role = serializers.ChoiceField(choices=["user", "assistant", "tool"])
    content = ContentField(required=False)
    reasoning_content = StrictCharField(max_length=MAX_TEXT, allow_blank=True, required=False)
    tool_calls = ToolCallSerializer(many=True, required=False, max_length=64)
    tool_call_id = StrictCharField(max_length=100, required=False)
    stats = AnswerStatsSerializer(required=False)
    version_index = StrictIntegerField(min_value=0, max_value=MAX_VERSIONS, required=False)

    def get_fields(self):
        """`versions`: the message's other versions (Regenerate, Edit), each with what followed it (lazy: recursive)."""
        fields = super().get_fields()
        fields["versions"] = VersionSerializer(many=True, required=False, max_length=MAX_VERSIONS)
        return fields


class VersionSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """An earlier (or later) version of a message and the messages that followed it then."""

    def get_fields(self):
        return {"message": MessageSerializer(), "tail": MessageSerializer(many=True, max_length=MAX_MESSAGES)}


class ConversationOptionsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """The page's settings for a conversation (sent with each turn as the chat API's fields)."""

    temperature = StrictFloatField(min_value=0, max_value=2, required=False, allow_null=True)
    top_p = StrictFloatField(min_value=0, max_value=1, required=False, allow_null=True)
    max_tokens = StrictIntegerField(min_value=1, max_value=1_000_000, required=False, allow_null=True)
    thinking = serializers.ChoiceField(choices=["auto", "on", "off"], required=False)
    tools = StrictCharField(max_length=MAX_TEXT, allow_blank=True, required=False)
    # When the next turn does not fit the model's context (static/webui/js/context-window.js).
    overflow = serializers.ChoiceField(choices=["rolling", "middle", "stop"], required=False)


class ConversationSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """A new conversation (the first turn, or an import); PATCH changes its settings, never its messages."""

    title = StrictCharField(max_length=200, allow_blank=False)
    model = StrictCharField(max_length=200, allow_blank=True, required=False, default="")
    system_prompt = StrictCharField(max_length=MAX_TEXT, allow_blank=True, required=False, default="")
    options = ConversationOptionsSerializer(required=False, default=dict)
    messages = MessageSerializer(many=True, required=False, default=list, max_length=MAX_MESSAGES)


class ConversationSettingsSerializer(ConversationSerializer):
    """PATCH: a rename, another model or other settings. Messages change only through turns."""

    messages = None


class TurnsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """`POST …/turns`: replace the messages from index `at` on (at = length: an append) if `version` is current."""

    version = StrictIntegerField(min_value=0)
    at = StrictIntegerField(min_value=0, max_value=MAX_MESSAGES)
    messages = MessageSerializer(many=True, max_length=MAX_MESSAGES)


def conversation_body(conversation, with_messages: bool = True) -> dict:
    """A conversation as the page reads it."""
    body = {
        "id": conversation.id,
        "title": conversation.title,
        "model": conversation.model,
        "version": conversation.version,
        "created_at": conversation.created_at.isoformat(),
        "updated_at": conversation.updated_at.isoformat(),
    }
    if with_messages:
        body.update(system_prompt=conversation.system_prompt, options=conversation.options,
                    messages=conversation.messages)
    return body
