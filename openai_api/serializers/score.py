"""`POST /v1/score` and `POST /v1/rerank` requests: vLLM's shapes (rerank: also Cohere's and Jina's).

Score takes two sides under any of vLLM's names — `text_1`/`text_2`, `queries`/`documents`,
`queries`/`items` or `data_1`/`data_2` — each a string or a list of strings, paired as vLLM pairs
them: 1:1, 1:N (the one first text against every second text) or N:N (element by element). Both
become one job of `PairPrompt`s (workers.engine.tasks.pair_scoring answers one score per pair).
"""
from __future__ import annotations

from rest_framework import serializers

from protocol import JobParams, PairPrompt

from .embeddings import MAX_INPUTS
from .fields import ModelNameField, RejectUnknownFieldsMixin, StrictBooleanField, StrictCharField, StrictIntegerField
from .openai_params import usage_tags

SIDES = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))
ACTIVATION_HELP = ("vLLM's: a cross-encoder's activation (sigmoid, or what its config names) on its logit; "
                   "false: the raw logit. Embedding models score by cosine either way.")


class ScoreInputField(serializers.Field):
    """A non-empty string or a list of up to MAX_INPUTS of them; always a list inside."""

    default_error_messages = {
        "invalid": "Must be a string or a list of strings.",
        "empty": "Must not be empty (nor hold an empty string).",
        "too_many": f"At most {MAX_INPUTS} texts are allowed in one request.",
    }

    def to_internal_value(self, data):
        items = [data] if isinstance(data, str) else data
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            self.fail("invalid")
        if not items or any(item == "" for item in items):
            self.fail("empty")
        if len(items) > MAX_INPUTS:
            self.fail("too_many")
        return items

    def to_representation(self, value):
        return value


def pair_prompts(pairs: list[tuple[str, str]], use_activation: bool | None) -> list[PairPrompt]:
    return [{"pair": [first, second], "activation": use_activation} for first, second in pairs]


class ScoreRequestSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    model = ModelNameField()
    text_1 = ScoreInputField(required=False, help_text="the first texts (or `queries`, or `data_1`)")
    text_2 = ScoreInputField(required=False, help_text="the second texts (or `documents`, `items`, or `data_2`)")
    queries = ScoreInputField(required=False)
    documents = ScoreInputField(required=False)
    items = ScoreInputField(required=False)
    data_1 = ScoreInputField(required=False)
    data_2 = ScoreInputField(required=False)
    use_activation = StrictBooleanField(required=False, allow_null=True, default=None, help_text=ACTIVATION_HELP)
    user = StrictCharField(required=False, allow_blank=True, max_length=512)

    def validate(self, attrs: dict) -> dict:
        present = {name for pair in SIDES for name in pair if name in attrs}
        named = [pair for pair in SIDES if set(pair) == present]
        if len(named) != 1:
            alone = [b if a in present else a for a, b in SIDES if len(present) == 1 and present & {a, b}]
            raise serializers.ValidationError({(alone or ["text_1"])[0]: [
                "Send the two sides under one pair of names: text_1 and text_2, queries and documents, "
                "queries and items, or data_1 and data_2."]})
        first_name, second_name = named[0]
        first, second = attrs[first_name], attrs[second_name]
        if len(first) > 1 and len(first) != len(second):
            raise serializers.ValidationError({second_name: [
                f"Input lengths must be either 1:1, 1:N or N:N ({first_name} has {len(first)}, "
                f"{second_name} has {len(second)})."]})
        attrs["pairs"] = list(zip(first * len(second) if len(first) == 1 else first, second))
        return attrs

    def job_prompts(self) -> list[PairPrompt]:
        data = self.validated_data
        return pair_prompts(data["pairs"], data["use_activation"])

    def job_params(self) -> JobParams:
        """Nothing is generated: the worker scores each pair (workers.engine.tasks.pair_scoring)."""
        return JobParams(max_tokens=0)

    def usage_tags(self) -> dict:
        return usage_tags(self.validated_data)


class RerankRequestSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """vLLM's, Cohere's and Jina's rerank request: the query scored against every document."""

    model = ModelNameField()
    query = StrictCharField()
    documents = serializers.ListField(child=StrictCharField(), min_length=1, max_length=MAX_INPUTS)
    top_n = StrictIntegerField(required=False, allow_null=True, min_value=0,
                               help_text="the best `top_n` documents (0 or absent: all of them)")
    return_documents = StrictBooleanField(required=False, default=True)
    use_activation = StrictBooleanField(required=False, allow_null=True, default=None, help_text=ACTIVATION_HELP)

    def job_prompts(self) -> list[PairPrompt]:
        data = self.validated_data
        return pair_prompts([(data["query"], document) for document in data["documents"]], data["use_activation"])

    def job_params(self) -> JobParams:
        return JobParams(max_tokens=0)
