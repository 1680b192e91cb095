"""`POST /v1/completions` request: vLLM's legacy parameter set, each with its bounds."""
from __future__ import annotations

from rest_framework import serializers

from protocol import JobParams, Prompt, to_job_params

from .fields import RejectUnknownFieldsMixin, StrictBooleanField, StrictCharField, StrictIntegerField
from .openai_params import usage_tags
from .sampling import SamplingParamsSerializer, first_given
from .structured import StructuredOutputsField, constrain, output_grammar

DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy default; chat and responses default to the rest of the context


class PromptField(serializers.Field):
    """A string, a list of strings, a list of token ids, or a list of token-id lists.

    Always a list of prompts inside: each a string or a list of ints.
    """

    default_error_messages = {
        "invalid": "prompt must be a string, a list of strings, a list of token ids, or a list of token-id lists.",
        "empty": "prompt must not be empty.",
    }

    max_items: int | None = None  # None: the server's max_prompts

    @staticmethod
    def _is_token_list(value) -> bool:
        return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)

    def to_internal_value(self, data):
        if isinstance(data, str):
            prompts = [data]
        elif self._is_token_list(data) and data:
            prompts = [data]
        elif isinstance(data, list) and data and all(isinstance(p, str) for p in data):
            prompts = data
        elif isinstance(data, list) and data and all(self._is_token_list(p) for p in data):
            prompts = data
        elif data == []:
            self.fail("empty")
        else:
            self.fail("invalid")
        for prompt in prompts:
            if len(prompt) == 0:
                self.fail("empty")
            if isinstance(prompt, list) and any(t < 0 for t in prompt):
                raise serializers.ValidationError("Token ids must be non-negative.")
        limit = self.max_items or self.context.get("max_prompts", 64)
        if len(prompts) > limit:
            raise serializers.ValidationError(f"At most {limit} prompts are allowed in one request.")
        return prompts

    def to_representation(self, value):
        return value


class CompletionRequestSerializer(RejectUnknownFieldsMixin, SamplingParamsSerializer):
    prompt = PromptField()
    suffix = StrictCharField(required=False, allow_null=True, allow_blank=True)
    max_tokens = StrictIntegerField(required=False, allow_null=True, min_value=0)
    logprobs = StrictIntegerField(required=False, allow_null=True, min_value=0,
                                  help_text="0 to the server's max_logprobs (20 by default, as vLLM)")
    echo = StrictBooleanField(required=False, default=False)
    best_of = StrictIntegerField(required=False, allow_null=True, min_value=1)
    return_token_ids = StrictBooleanField(required=False, default=False)
    add_special_tokens = StrictBooleanField(required=False, default=True,
                                            help_text="add the tokenizer's special tokens (BOS) to string prompts")
    structured_outputs = StructuredOutputsField(required=False, allow_null=True)

    def validate_logprobs(self, value: int | None) -> int | None:
        return self.check_logprobs(value)

    def validate(self, attrs: dict) -> dict:
        best_of = attrs.get("best_of")
        if attrs.get("use_beam_search") and best_of is not None:  # vLLM's beam width may be best_of
            attrs["n_beams_from"], attrs["best_of"], best_of = best_of, None, None
        if best_of is not None and best_of != attrs.get("n", 1):
            raise serializers.ValidationError({"best_of": ["best_of is only supported when equal to n."]})
        if attrs.get("stream") and best_of not in (None, 1) and best_of != attrs.get("n", 1):
            raise serializers.ValidationError({"best_of": ["best_of cannot be used with stream."]})
        if attrs.get("stream_options") and not attrs.get("stream"):
            raise serializers.ValidationError({"stream_options": ["stream_options is only allowed when stream is true."]})
        max_tokens = first_given(attrs, "max_tokens", "max_new_tokens")
        self.check_min_tokens(attrs, DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens)
        self.common(attrs, attrs.pop("n_beams_from", None))
        self.validate_beams(attrs)
        attrs["structured"] = output_grammar(attrs, [], self.context)
        return attrs

    def job_params(self) -> JobParams:
        data = self.validated_data
        max_tokens = first_given(data, "max_tokens", "max_new_tokens")
        params = to_job_params(data, max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                               logprobs=data.get("logprobs"), echo=data["echo"], suffix=data.get("suffix") or None)
        return constrain(params, data)

    def usage_tags(self) -> dict:
        return usage_tags(self.validated_data)

    def job_prompts(self) -> list[Prompt]:
        """The prompts as the job carries them: strings become {"text", "add_special_tokens"} when BOS is off."""
        prompts = self.validated_data["prompt"]
        if self.validated_data["add_special_tokens"]:
            return prompts
        return [{"text": p, "add_special_tokens": False} if isinstance(p, str) else p for p in prompts]
