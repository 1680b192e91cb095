"""`POST /tokenize` and `POST /detokenize` requests (vLLM's shapes)."""
from __future__ import annotations

from rest_framework import serializers

from protocol import Conversation, JobParams, TextPrompt, TokenIdsPrompt

from .content import invalid
from .conversation import ConversationSerializer, MessagesField
from .fields import ModelNameField, RejectUnknownFieldsMixin, StrictBooleanField, StrictCharField, StrictIntegerField


class TokenizeRequestSerializer(RejectUnknownFieldsMixin, ConversationSerializer):
    """`prompt` (raw text) or `messages` (rendered as chat renders them)."""

    model = ModelNameField()
    prompt = StrictCharField(required=False, allow_blank=True)
    messages = MessagesField(required=False)
    add_special_tokens = StrictBooleanField(required=False, default=True)
    return_token_strs = StrictBooleanField(required=False, default=False,
                                           help_text="vLLM's: also each token as text (token_strs)")

    def validate(self, attrs: dict) -> dict:
        if ("messages" in attrs) == ("prompt" in attrs):
            raise invalid("prompt", "Send either prompt or messages (exactly one).")
        self.validate_template_options(attrs)
        return attrs

    def job_prompts(self) -> list[Conversation | TextPrompt]:
        data = self.validated_data
        if "messages" in data:
            return [self.conversation()]
        return [{"text": data["prompt"], "add_special_tokens": data["add_special_tokens"]}]

    def job_params(self) -> JobParams:
        """A zero-token job: the worker tokenizes, reports the ids in `started`, and finishes; with
        return_token_strs the prompt is also scored, for each token's text (prompt_logprobs)."""
        return JobParams(max_tokens=0, prompt_logprobs=0 if self.validated_data["return_token_strs"] else None)


class DetokenizeRequestSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    model = ModelNameField()
    tokens = serializers.ListField(child=StrictIntegerField(min_value=0), max_length=1_000_000)

    def job_prompts(self) -> list[TokenIdsPrompt]:
        return [{"token_ids": self.validated_data["tokens"]}]

    def job_params(self) -> JobParams:
        """A zero-token job whose echo is the text of the ids."""
        return JobParams(max_tokens=0, echo=True)
