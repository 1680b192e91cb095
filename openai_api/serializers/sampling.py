"""Sampling parameters shared by every generation endpoint (OpenAI + Hugging Face extras)."""
from __future__ import annotations

from rest_framework import serializers

from .fields import (
    EarlyStoppingField,
    LogitBiasField,
    ModelNameField,
    StopField,
    StreamOptionsSerializer,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StringListField,
    TokenIdsField,
    TokenSequencesField,
)
from .generation_config import expand_generation_config
from .openai_params import priority_class

def first_given(data: dict, *names: str):
    """The first of these fields the request set (not null), else None."""
    return next((data[name] for name in names if data.get(name) is not None), None)


INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1  # token counts and ids beyond this fit no model; the worker checks the model's own limits


class SamplingParamsSerializer(serializers.Serializer):
    model = ModelNameField()
    temperature = StrictFloatField(required=False, allow_null=True, min_value=0.0, max_value=2.0)
    top_p = StrictFloatField(required=False, allow_null=True, min_value=0.0, max_value=1.0)
    n = StrictIntegerField(required=False, default=1, min_value=1)
    stream = StrictBooleanField(required=False, default=False)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True)
    presence_penalty = StrictFloatField(required=False, allow_null=True, min_value=-2.0, max_value=2.0)
    frequency_penalty = StrictFloatField(required=False, allow_null=True, min_value=-2.0, max_value=2.0)
    logit_bias = LogitBiasField(required=False, allow_null=True)
    seed = StrictIntegerField(required=False, allow_null=True, min_value=-INT64_MAX - 1, max_value=INT64_MAX)
    user = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=512)
    # Hugging Face / vLLM extras (the OpenAI SDK's extra_body lands at top level).
    top_k = StrictIntegerField(required=False, allow_null=True, min_value=-1, max_value=INT32_MAX)
    min_p = StrictFloatField(required=False, allow_null=True, min_value=0.0, max_value=1.0)
    repetition_penalty = StrictFloatField(required=False, allow_null=True, min_value=0.01, max_value=10.0)
    no_repeat_ngram_size = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=INT32_MAX)
    ignore_eos = StrictBooleanField(required=False, default=False)
    min_tokens = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=INT32_MAX)
    typical_p = StrictFloatField(required=False, allow_null=True, min_value=0.0, max_value=1.0)
    bad_words = StringListField(required=False, allow_null=True)
    bad_words_ids = TokenSequencesField(required=False, allow_null=True)
    min_length = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=INT32_MAX)
    # Beam search (Hugging Face's generate): deterministic, so temperature/top_* do not apply to it.
    num_beams = StrictIntegerField(required=False, allow_null=True, min_value=1)
    length_penalty = StrictFloatField(required=False, allow_null=True, min_value=-10.0, max_value=10.0)
    early_stopping = EarlyStoppingField(required=False, allow_null=True)
    use_beam_search = StrictBooleanField(required=False, default=False,
                                         help_text="vLLM's: beam search n wide (num_beams = max(n, best_of))")
    # vLLM's extras, as vLLM honours them (docs/api-parameters.md).
    stop_token_ids = TokenIdsField(required=False, allow_null=True)
    include_stop_str_in_output = StrictBooleanField(required=False, default=False)
    skip_special_tokens = StrictBooleanField(required=False, default=True)
    spaces_between_special_tokens = StrictBooleanField(required=False, default=True)
    truncate_prompt_tokens = StrictIntegerField(required=False, allow_null=True, min_value=-1, max_value=INT32_MAX)
    allowed_token_ids = TokenIdsField(max_items=1_000_000, min_items=1, required=False, allow_null=True)
    return_tokens_as_token_ids = StrictBooleanField(required=False, default=False)
    prompt_logprobs = StrictIntegerField(required=False, allow_null=True, min_value=0)
    priority = StrictIntegerField(required=False, allow_null=True, min_value=-INT32_MAX, max_value=INT32_MAX,
                                  help_text="vLLM's (lower: sooner); above 0 is the batch priority class")
    # transformers serve's: a GenerationConfig (JSON string or object) whose keys set the fields they mean
    # (openai_api/serializers/generation_config.py), and two of its keys as fields of their own.
    generation_config = serializers.JSONField(required=False, allow_null=True,
                                              help_text="a GenerationConfig as JSON; the request's own fields win")
    do_sample = StrictBooleanField(required=False, allow_null=True,
                                   help_text="false: greedy (whatever the temperature); default: sample unless the "
                                             "model's generation_config.json says do_sample false")
    max_new_tokens = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=INT32_MAX,
                                        help_text="the endpoint's max_tokens field, Hugging Face's name")

    def run_validation(self, data=serializers.empty):
        return super().run_validation(expand_generation_config(data))

    def validate_truncate_prompt_tokens(self, value: int | None) -> int | None:
        if value == 0:
            raise serializers.ValidationError("Must be at least 1, or -1 for the model's context.")
        return value

    def validate_prompt_logprobs(self, value: int | None) -> int | None:
        return self.check_logprobs(value)

    def check_logprobs(self, value: int | None) -> int | None:
        """At most the server's max_logprobs alternatives per token (vLLM's limit, 20 by default)."""
        limit = self.context.get("max_logprobs", 20)
        if value is not None and value > limit:
            raise serializers.ValidationError(f"Ensure this value is less than or equal to {limit} (max_logprobs).")
        return value

    def common(self, attrs: dict, n_beams_from: int | None = None) -> None:
        """What every generation endpoint settles alike: the priority class, vLLM's use_beam_search."""
        attrs["priority_class"] = priority_class(attrs)
        self.server_defaults(attrs)
        if attrs.get("use_beam_search") and not attrs.get("num_beams"):
            width = max(attrs.get("n", 1), n_beams_from or 1)
            if width > 1:
                attrs["num_beams"] = width
            else:  # a one-wide beam search is greedy decoding
                attrs["temperature"] = 0.0

    def server_defaults(self, attrs: dict) -> None:
        """`serve --default-seed/--ignore-eos` where the request is silent; `--stop-sequences` beside its own stops."""
        defaults = self.context.get("request_defaults") or {}
        if attrs.get("seed") is None and defaults.get("seed") is not None:
            attrs["seed"] = defaults["seed"]
        sent = self.initial_data if isinstance(getattr(self, "initial_data", None), dict) else {}
        if defaults.get("ignore_eos") and sent.get("ignore_eos") is None:
            attrs["ignore_eos"] = True
        if defaults.get("stop"):
            own = list(attrs.get("stop") or [])
            attrs["stop"] = own + [stop for stop in defaults["stop"] if stop not in own]

    def validate_typical_p(self, value: float | None) -> float | None:
        if value is not None and value <= 0.0:
            raise serializers.ValidationError("Ensure this value is greater than 0.")
        return value

    def validate_num_beams(self, value: int | None) -> int | None:
        limit = self.context.get("max_beams", 16)
        if value is not None and value > limit:
            raise serializers.ValidationError(f"Ensure this value is less than or equal to {limit}.")
        return value

    def validate_beams(self, attrs: dict) -> None:
        """n <= num_beams: the n best beams come back."""
        beams = attrs.get("num_beams") or 1
        if beams > 1 and attrs.get("n", 1) > beams:
            raise serializers.ValidationError({"n": [f"n ({attrs['n']}) must not exceed num_beams ({beams})."]})

    def validate_n(self, value: int) -> int:
        limit = self.context.get("max_n", 16)
        if value > limit:
            raise serializers.ValidationError(f"Ensure this value is less than or equal to {limit}.")
        return value

    @staticmethod
    def check_min_tokens(attrs: dict, max_tokens: int | None) -> None:
        """min_tokens may not exceed max_tokens (as vLLM); without max_tokens the worker checks the context."""
        min_tokens = attrs.get("min_tokens")
        if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
            raise serializers.ValidationError(
                {"min_tokens": [f"min_tokens ({min_tokens}) must be at most max_tokens ({max_tokens})."]})

