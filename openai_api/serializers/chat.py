"""`POST /v1/chat/completions` request: messages (or a raw prompt), sampling, tools, template options.

Messages, tools and tool_choice are checked here so a bad conversation is a 400 before any job
is sent; the worker only renders what passed.
"""
from __future__ import annotations

import json

from rest_framework import serializers

from workers.protocol import Conversation, JobParams, to_job_params

from .content import invalid, message_content
from .fields import RejectUnknownFieldsMixin, StrictBooleanField, StrictCharField, StrictIntegerField
from .openai_params import ChatOpenAIParamsSerializer, legacy_functions, thinking_kwargs, usage_tags
from .sampling import SamplingParamsSerializer
from .structured import ResponseFormatField, StructuredOutputsField, constrain, output_grammar

ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning", "refusal"}
TOOL_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
# Names apply_chat_template takes itself: a request may not smuggle them in as template kwargs.
RESERVED_TEMPLATE_KWARGS = {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                            "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                            "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}


def tool_call_arguments(arguments, path: str):
    """Arguments as templates expect them: a dict when the JSON string is an object."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        raise invalid(path, "arguments must be a JSON string.")
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def clean_tool_calls(calls, path: str) -> list[dict]:
    if not isinstance(calls, list):
        raise invalid(path, "tool_calls must be a list.")
    cleaned = []
    for index, call in enumerate(calls):
        where = f"{path}[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise invalid(where, 'each tool call needs {"type": "function", "function": {"name", "arguments"}}.')
        cleaned.append({
            "id": str(call.get("id") or ""),
            "type": "function",
            "function": {"name": function["name"],
                         "arguments": tool_call_arguments(function.get("arguments", "{}"), f"{where}.function.arguments")},
        })
    return cleaned


def clean_message(message, index: int) -> dict:
    """One message in the shape chat templates expect (developer becomes system)."""
    path = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid(path, "each message must be an object.")
    unknown = sorted(set(message) - MESSAGE_KEYS)
    if unknown:
        raise invalid(f"{path}.{unknown[0]}", f"Unrecognized message field: {unknown[0]}")
    role = message.get("role")
    if role not in ROLES:
        raise invalid(f"{path}.role", f"role must be one of {', '.join(ROLES)}; got {role!r}.")
    cleaned: dict = {"role": "system" if role == "developer" else role}
    has_calls = role == "assistant" and bool(message.get("tool_calls"))
    cleaned["content"] = message_content(message.get("content"), f"{path}.content", allow_none=role == "assistant",
                                         allow_media=role == "user")
    if cleaned["content"] is None:
        cleaned["content"] = "" if not has_calls else None
    if isinstance(message.get("name"), str):
        cleaned["name"] = message["name"]
    if role == "assistant":
        if message.get("tool_calls"):
            cleaned["tool_calls"] = clean_tool_calls(message["tool_calls"], f"{path}.tool_calls")
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise invalid(f"{path}.reasoning_content", "reasoning_content must be a string.")
            cleaned["reasoning_content"] = reasoning
    elif message.get("tool_calls"):
        raise invalid(f"{path}.tool_calls", "only assistant messages may have tool_calls.")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid(f"{path}.tool_call_id", "a tool message needs the tool_call_id it answers.")
        cleaned["tool_call_id"] = call_id
    return cleaned


class MessagesField(serializers.Field):
    """A non-empty list; each message is checked in ConversationSerializer (for exact error paths)."""

    def to_internal_value(self, data):
        if not isinstance(data, list):
            raise serializers.ValidationError("messages must be a list of messages.")
        if not data:
            raise serializers.ValidationError("messages must not be empty.")
        return data

    def to_representation(self, value):
        return value


def clean_tool(tool, index: int) -> dict:
    """A Chat Completions function tool: {"type": "function", "function": {name, description?, parameters?}}."""
    path = f"tools[{index}]"
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
        raise invalid(path, 'each tool must be {"type": "function", "function": {...}}.')
    name = function.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise invalid(f"{path}.function.name", "a function name is required (at most 64 characters).")
    if not isinstance(function.get("parameters", {}), dict):
        raise invalid(f"{path}.function.parameters", "parameters must be a JSON Schema object.")
    if not isinstance(function.get("description", ""), str):
        raise invalid(f"{path}.function.description", "description must be a string.")
    unknown = sorted(set(function) - TOOL_FUNCTION_KEYS)
    if unknown:
        raise invalid(f"{path}.function.{unknown[0]}", f"Unrecognized function field: {unknown[0]}")
    # As sent, in the client's key order: templates print tools with `tojson`.
    return {"type": "function", "function": dict(function)}


class ToolsField(serializers.Field):
    def to_internal_value(self, data):
        if not isinstance(data, list):
            raise serializers.ValidationError("tools must be a list.")
        if len(data) > 128:
            raise serializers.ValidationError("At most 128 tools are allowed.")
        return data

    def to_representation(self, value):
        return value


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


class TemplateKwargsField(serializers.Field):
    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("chat_template_kwargs must be an object.")
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(data))
        if reserved:
            raise serializers.ValidationError(f"{reserved[0]} cannot be set through chat_template_kwargs.")
        return data

    def to_representation(self, value):
        return value


class ConversationSerializer(serializers.Serializer):
    """The template side of a request, shared by chat, /tokenize and Responses."""

    tools = ToolsField(required=False, allow_null=True)
    chat_template_kwargs = TemplateKwargsField(required=False, allow_null=True)
    add_generation_prompt = StrictBooleanField(required=False, default=True)
    continue_final_message = StrictBooleanField(required=False, default=False)

    def validate_template_options(self, attrs: dict) -> None:
        """Clean messages and tools (errors name e.g. `messages[1].role`), check the template flags."""
        if attrs.get("messages") is not None:
            attrs["messages"] = [clean_message(message, index) for index, message in enumerate(attrs["messages"])]
        if attrs.get("tools"):
            attrs["tools"] = [clean_tool(tool, index) for index, tool in enumerate(attrs["tools"])]
        messages = attrs.get("messages")
        if attrs.get("continue_final_message"):
            if attrs.get("add_generation_prompt") and "add_generation_prompt" in self.initial_data:
                raise invalid("continue_final_message",
                              "continue_final_message and add_generation_prompt cannot both be true.")
            attrs["add_generation_prompt"] = False
            if messages is not None and messages[-1]["role"] != "assistant":
                raise invalid("continue_final_message", "continue_final_message needs a final assistant message.")

    def conversation(self, extra_kwargs: dict | None = None) -> Conversation:
        """The job prompt (see workers.protocol) for these messages."""
        data = self.validated_data
        return {
            "messages": data["messages"],
            "tools": data.get("tools") or None,
            "chat_template_kwargs": {**(extra_kwargs or {}), **(data.get("chat_template_kwargs") or {})},
            "add_generation_prompt": data["add_generation_prompt"],
            "continue_final_message": data["continue_final_message"],
        }


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
        max_tokens = attrs.get("max_completion_tokens")
        self.check_min_tokens(attrs, attrs.get("max_tokens") if max_tokens is None else max_tokens)
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

    @property
    def parse_tools(self) -> bool:
        data = self.validated_data
        return bool(data.get("tools")) and data.get("tool_choice") != "none"

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

    def job_params(self) -> JobParams:
        data = self.validated_data
        max_tokens = data.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = data.get("max_tokens")
        params = to_job_params(data, max_tokens=max_tokens,
                               logprobs=(data.get("top_logprobs") or 0) if data["logprobs"] else None)
        return constrain(params, data, data.get("tools") or [])
