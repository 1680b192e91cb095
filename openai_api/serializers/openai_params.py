"""OpenAI's request parameters beyond sampling, for chat and Responses: each honoured, or accepted and ignored.

Clients built on the SDK's typed parameters send them; refusing them as unknown broke those
clients. What each one does here is in docs/api-parameters.md; a field whose help text starts
with IGNORED says so in the OpenAPI schema too.
"""
from __future__ import annotations

from rest_framework import serializers

from .content import invalid
from .fields import RejectUnknownFieldsMixin, StrictBooleanField, StrictCharField, StrictIntegerField

IGNORED = "Accepted and ignored: "
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast")
BATCH_TIERS = ("flex",)  # the fair-share scheduler's batch class
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
SUMMARIES = ("auto", "concise", "detailed")
THINKING_OFF = ("none", "minimal")  # a template's enable_thinking switch is off for these
INCLUDABLE = ("file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
              "message.input_image.image_url", "computer_call_output.output.image_url",
              "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs")


class StrictChoiceField(serializers.ChoiceField):
    """A string out of `choices` (DRF's own would take 1 for "1")."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


class ObjectField(serializers.Field):
    """Any JSON object (a parameter accepted and ignored keeps only its shape checked)."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("Must be an object.")
        return data

    def to_representation(self, value):
        return value


class MetadataField(serializers.Field):
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 characters, values up to 512."""

    def to_internal_value(self, data):
        if not isinstance(data, dict) or len(data) > 16:
            raise serializers.ValidationError("metadata must be an object of at most 16 pairs.")
        for key, value in data.items():
            if len(key) > 64 or not isinstance(value, str) or len(value) > 512:
                raise serializers.ValidationError(
                    "metadata keys are strings of at most 64 characters, values strings of at most 512.")
        return data

    def to_representation(self, value):
        return value


class ModalitiesField(serializers.Field):
    """Output modalities: only text is generated here, so ["text"] (or nothing) is the one accepted value."""

    def to_internal_value(self, data):
        if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
            raise serializers.ValidationError('modalities must be a list such as ["text"].')
        unsupported = sorted(set(data) - {"text"})
        if unsupported:
            raise serializers.ValidationError(f"Output modality {unsupported[0]!r} is not supported: only text.")
        return data

    def to_representation(self, value):
        return value


class ReasoningSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """Responses' `reasoning`: `effort` switches the template's thinking; summaries are not made (ignored)."""

    effort = StrictChoiceField(choices=REASONING_EFFORTS, required=False, allow_null=True)
    summary = StrictChoiceField(choices=SUMMARIES, required=False, allow_null=True,
                                help_text=IGNORED + "the reasoning item carries the model's whole reasoning text.")
    generate_summary = StrictChoiceField(choices=SUMMARIES, required=False, allow_null=True,
                                         help_text=IGNORED + "deprecated name of summary.")


class ResponsesStreamOptionsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    include_obfuscation = StrictBooleanField(required=False, default=False,
                                             help_text=IGNORED + "events are never padded with obfuscation.")


class TaggedRequestSerializer(serializers.Serializer):
    """What chat and Responses share: usage-record tags, the service tier, prompt-cache hints."""

    store = StrictBooleanField(required=False, allow_null=True)
    metadata = MetadataField(required=False, allow_null=True)
    service_tier = StrictChoiceField(choices=SERVICE_TIERS, required=False, allow_null=True,
                                     help_text='the scheduler\'s priority class: "flex" is batch, the others interactive')
    safety_identifier = StrictCharField(required=False, allow_null=True, max_length=512)
    prompt_cache_key = StrictCharField(required=False, allow_null=True, max_length=512)
    prompt_cache_retention = StrictChoiceField(choices=("in_memory", "in-memory", "24h"), required=False,
                                               allow_null=True, help_text=IGNORED + "the prefix cache keeps blocks "
                                               "while its memory budget allows.")
    prompt_cache_options = ObjectField(required=False, allow_null=True,
                                       help_text=IGNORED + "the prefix cache needs no options.")
    moderation = ObjectField(required=False, allow_null=True, help_text=IGNORED + "no moderation is run.")


class ChatOpenAIParamsSerializer(TaggedRequestSerializer):
    """Chat Completions' own parameters beyond sampling and tools."""

    reasoning_effort = StrictChoiceField(choices=REASONING_EFFORTS, required=False, allow_null=True,
                                         help_text="the template's enable_thinking (off for none/minimal) and "
                                         "reasoning_effort kwargs")
    verbosity = StrictChoiceField(choices=("low", "medium", "high"), required=False, allow_null=True,
                                  help_text=IGNORED + "open models have no verbosity control.")
    modalities = ModalitiesField(required=False, allow_null=True)
    audio = ObjectField(required=False, allow_null=True, help_text="audio output: only null (text is generated)")
    prediction = ObjectField(required=False, allow_null=True,
                             help_text=IGNORED + "predicted outputs only change latency, never the answer.")
    web_search_options = ObjectField(required=False, allow_null=True, help_text=IGNORED + "there is no web search.")
    functions = serializers.JSONField(required=False, allow_null=True, help_text="deprecated: becomes tools")
    function_call = serializers.JSONField(required=False, allow_null=True, help_text="deprecated: becomes tool_choice")

    def validate_audio(self, value):
        if value is not None:
            raise serializers.ValidationError("Audio output is not supported: only text is generated.")
        return value


class ResponsesOpenAIParamsSerializer(TaggedRequestSerializer):
    """Responses' own parameters beyond sampling and tools."""

    background = StrictBooleanField(required=False, default=False)
    include = serializers.ListField(child=StrictChoiceField(choices=INCLUDABLE), required=False, allow_null=True,
                                    max_length=len(INCLUDABLE))
    max_tool_calls = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=1024)
    reasoning = ReasoningSerializer(required=False, allow_null=True)
    top_logprobs = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=20)
    truncation = StrictChoiceField(choices=("auto", "disabled"), required=False, allow_null=True)
    stream_options = ResponsesStreamOptionsSerializer(required=False, allow_null=True)
    conversation = serializers.JSONField(required=False, allow_null=True,
                                         help_text='a conversation id (or {"id"}) whose items come before input')
    prompt = ObjectField(required=False, allow_null=True,
                         help_text=IGNORED + "there are no stored prompt templates; send the prompt in input.")
    context_management = serializers.JSONField(required=False, allow_null=True,
                                               help_text=IGNORED + "use truncation: \"auto\".")
    image = ObjectField(required=False, allow_null=True, help_text=IGNORED + "images are not generated.")
    access_programs = ObjectField(required=False, allow_null=True, help_text=IGNORED + "no access programs here.")


def thinking_kwargs(effort: str | None) -> dict:
    """reasoning_effort as template kwargs: Qwen-style `enable_thinking` and gpt-oss-style `reasoning_effort`."""
    if effort is None:
        return {}
    return {"enable_thinking": effort not in THINKING_OFF, "reasoning_effort": effort}


def priority_class(data: dict) -> str:
    """The fair-share class: OpenAI's service_tier "flex" and vLLM's priority > 0 are batch work."""
    if data.get("service_tier") in BATCH_TIERS or (data.get("priority") or 0) > 0:
        return "batch"
    return "interactive"


def usage_tags(data: dict) -> dict:
    """What the usage record keeps of a request's own labels (only those sent)."""
    names = ("metadata", "user", "safety_identifier", "service_tier", "prompt_cache_key")
    return {name: data[name] for name in names if data.get(name) not in (None, "", {})}


def legacy_functions(attrs: dict) -> None:
    """The deprecated `functions` / `function_call` as tools / tool_choice (with the new names winning)."""
    functions, call = attrs.pop("functions", None), attrs.pop("function_call", None)
    if functions is not None:
        if not isinstance(functions, list):
            raise invalid("functions", "functions must be a list of function definitions.")
        if attrs.get("tools"):
            raise invalid("functions", "Send tools or the deprecated functions, not both.")
        attrs["tools"] = [{"type": "function", "function": function} for function in functions]
    if call is not None and attrs.get("tool_choice") is None:
        if call in ("none", "auto"):
            attrs["tool_choice"] = call
        elif isinstance(call, dict) and isinstance(call.get("name"), str):
            attrs["tool_choice"] = {"type": "function", "function": {"name": call["name"]}}
        else:
            raise invalid("function_call", 'function_call must be "none", "auto" or {"name": ...}.')
