"""`POST /v1/chat/completions` request: messages (or a raw prompt), sampling, tools, template options.

Messages, tools and tool_choice are checked here so a bad conversation is a 400 before any job
is sent; the worker only renders what passed.
"""
from __future__ import annotations

from rest_framework import serializers

from protocol import Conversation, JobParams, to_job_params

from .content import invalid
from .conversation import ConversationSerializer, MessagesField
from .fields import RejectUnknownFieldsMixin, StrictBooleanField, StrictCharField, StrictIntegerField
from .openai_params import ChatOpenAIParamsSerializer, legacy_functions, thinking_kwargs, usage_tags
from .sampling import SamplingParamsSerializer, first_given
from .structured import ResponseFormatField, StructuredOutputsField, output_grammar, parsed_answer


def requested_max_tokens(data: dict) -> int | None:
    """`max_completion_tokens` when given, else the older `max_tokens`, else Hugging Face's `max_new_tokens`
    (None: the model's default, else the rest of the context)."""
    return first_given(data, "max_completion_tokens", "max_tokens", "max_new_tokens")


class ToolChoiceField(serializers.Field):
    def to_internal_value(self, data):
        if data in ("none", "auto", "required"):
            return data
        function = data.get("function") if isinstance(data, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str) and data.get("type") == "function":
            return {"type": "function", "function": {"name": function["name"]}}
        raise serializers.ValidationError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.')

    def to_representation(self, value):
        return value



class DocumentsField(serializers.Field):
    """vLLM's `documents` for RAG chat templates: a list of objects (e.g. {"title", "text"})."""

    def to_internal_value(self, data):
        if not isinstance(data, list) or len(data) > 256 or not all(isinstance(doc, dict) for doc in data):
            raise serializers.ValidationError("documents must be a list of at most 256 objects.")
        return data

    def to_representation(self, value):
        return value


class ChatRequestSerializer(RejectUnknownFieldsMixin, ConversationSerializer, ChatOpenAIParamsSerializer,
                            SamplingParamsSerializer):
    messages = MessagesField(required=False)
    prompt = StrictCharField(required=False)
    max_tokens = StrictIntegerField(required=False, allow_null=True, min_value=0)
    max_completion_tokens = StrictIntegerField(required=False, allow_null=True, min_value=0)
    logprobs = StrictBooleanField(required=False, default=False)
    top_logprobs = StrictIntegerField(required=False, allow_null=True, min_value=0,
                                      help_text="0 to the server's max_logprobs (20 by default)")
    echo = StrictBooleanField(required=False, default=False,
                              help_text="vLLM's: the final assistant message's content starts the answer")
    documents = DocumentsField(required=False, allow_null=True)
    tool_choice = ToolChoiceField(required=False, allow_null=True)
    parallel_tool_calls = StrictBooleanField(required=False, allow_null=True)
    response_format = ResponseFormatField(required=False, allow_null=True)
    structured_outputs = StructuredOutputsField(required=False, allow_null=True)
    return_token_ids = StrictBooleanField(required=False, default=False)

    def validate_top_logprobs(self, value: int | None) -> int | None:
        return self.check_logprobs(value)

    def validate(self, attrs: dict) -> dict:
        if ("messages" in attrs) == ("prompt" in attrs):
            raise invalid("messages", "Send either messages or prompt (exactly one).")
        legacy_functions(attrs)
        if "prompt" in attrs and not attrs["prompt"]:
            raise invalid("prompt", "prompt must not be empty.")
        if attrs.get("top_logprobs") is not None and not attrs.get("logprobs"):
            raise invalid("top_logprobs", "top_logprobs needs logprobs to be true.")
        if attrs.get("stream_options") and not attrs.get("stream"):
            raise invalid("stream_options", "stream_options is only allowed when stream is true.")
        self.check_min_tokens(attrs, requested_max_tokens(attrs))
        self.validate_template_options(attrs)
        self._validate_tool_choice(attrs)
        self.common(attrs)
        self.validate_beams(attrs)
        attrs["structured"] = output_grammar(attrs, attrs.get("tools") or [], self.context)
        return attrs

    @staticmethod
    def _validate_tool_choice(attrs: dict) -> None:
        choice, tools = attrs.get("tool_choice"), attrs.get("tools") or []
        if choice in ("required", "auto") and not tools:  # as OpenAI and vLLM
            raise invalid("tool_choice", f'tool_choice "{choice}" needs tools.')
        if isinstance(choice, dict):
            name = choice["function"]["name"]
            if name not in {tool["function"]["name"] for tool in tools}:
                raise invalid("tool_choice", f"tool_choice names function {name!r}, which is not in tools.")

    def job_prompts(self) -> list[str | Conversation]:
        """The job's one prompt: raw text as sent, or the conversation for the worker's template."""
        data = self.validated_data
        if "prompt" in data:
            return [data["prompt"]]
        extra = thinking_kwargs(data.get("reasoning_effort"))
        if data.get("response_format"):
            extra["response_format"] = data["response_format"]
        conversation = self.conversation(extra)
        if data.get("documents"):
            conversation["documents"] = data["documents"]
        return [conversation]

    def usage_tags(self) -> dict:
        return usage_tags(self.validated_data)

    def job_field_names(self) -> dict[str, str]:
        """The job's `prompt` and `max_tokens` as this request calls them (in the worker's errors)."""
        data = self.validated_data
        limit = next((name for name in ("max_completion_tokens", "max_tokens", "max_new_tokens")
                      if data.get(name) is not None), "max_completion_tokens")
        return {"prompt": "prompt" if "prompt" in data else "messages", "max_tokens": limit}

    def job_params(self) -> JobParams:
        data = self.validated_data
        params = to_job_params(data, max_tokens=requested_max_tokens(data),
                               logprobs=(data.get("top_logprobs") or 0) if data["logprobs"] else None)
        return parsed_answer(params, data, data.get("tools") or [])
