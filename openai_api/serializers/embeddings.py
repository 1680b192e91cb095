"""`POST /v1/embeddings` request: OpenAI's shape (input, model, encoding_format, dimensions, user)."""
from __future__ import annotations

from rest_framework import serializers

from protocol import EmbeddingPrompt, JobParams

from .completions import PromptField
from .openai_params import usage_tags
from .fields import ModelNameField, RejectUnknownFieldsMixin, StrictCharField, StrictIntegerField

MAX_INPUTS = 2048  # OpenAI's limit on one request's inputs


class EmbeddingInputField(PromptField):
    """A string, a list of strings, a list of token ids, or a list of token-id lists (each one input)."""

    default_error_messages = {
        "invalid": "input must be a string, a list of strings, a list of token ids, or a list of token-id lists.",
        "empty": "input must not be empty (nor hold an empty string or list).",
    }

    max_items = MAX_INPUTS


class EmbeddingRequestSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    model = ModelNameField()
    input = EmbeddingInputField()
    encoding_format = serializers.ChoiceField(choices=["float", "base64"], required=False, default="float")
    dimensions = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=65536,
                                    help_text="the first `dimensions` components, renormalised (models that allow it)")
    user = StrictCharField(required=False, allow_blank=True, max_length=512)

    def job_prompts(self) -> list[EmbeddingPrompt]:
        data = self.validated_data
        return [{"embed": item, "dimensions": data.get("dimensions")} for item in data["input"]]

    def job_params(self) -> JobParams:
        """Nothing is generated: the worker pools each input's hidden states (workers.engine.tasks.embedding)."""
        return JobParams(max_tokens=0)

    def usage_tags(self) -> dict:
        return usage_tags(self.validated_data)
