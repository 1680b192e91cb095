"""The conversation part of a request, shared by chat, Responses and /tokenize: messages, tools, template options.

Messages and tools are checked here so a bad conversation is a 400 before any job is sent; the
worker only renders what passed.
"""
from __future__ import annotations

import json
import logging
import re

from django.conf import settings
from rest_framework import serializers

from protocol import Conversation

from .content import invalid, message_content
from .fields import StrictBooleanField

logger = logging.getLogger(__name__)
ROLES = ("system", "developer", "user", "assistant", "tool")
CUSTOM_ROLE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")  # a role of the client's own, passed to the template (vLLM's way)
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
    """One message in the shape chat templates expect (developer becomes system). Lenient where vLLM is: a
    field we do not know (clients add `cache_control`, vendor keys) is ignored with a debug line (with `serve
    --pass-message-extras` it goes to the template as sent), and a custom role (text content) goes to the
    template, which alone decides whether it takes it."""
    path = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid(path, "each message must be an object.")
    extras = settings.INFERENCE.api.pass_message_extras
    unknown = sorted(set(message) - MESSAGE_KEYS)
    if unknown and not extras:
        logger.debug("%s: ignoring fields the server does not know: %s", path, ", ".join(unknown))
        unknown = []
    role = message.get("role")
    if role not in ROLES:
        if isinstance(role, str) and CUSTOM_ROLE.fullmatch(role) and not message.get("tool_calls"):
            content = message_content(message.get("content"), f"{path}.content", allow_none=False, allow_media=False)
            named = {"name": message["name"]} if isinstance(message.get("name"), str) else {}
            return {**{key: message[key] for key in unknown}, "role": role, "content": content, **named}
        raise invalid(f"{path}.role", f"role must be one of {', '.join(ROLES)} or a name of your own "
                                      f"(letters, digits, _ . -); got {role!r}.")
    cleaned: dict = {key: message[key] for key in unknown}  # only with --pass-message-extras
    cleaned["role"] = "system" if role == "developer" else role
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
        """The job prompt (see protocol) for these messages."""
        data = self.validated_data
        return {
            "messages": data["messages"],
            "tools": data.get("tools") or None,
            "chat_template_kwargs": {**(extra_kwargs or {}), **(data.get("chat_template_kwargs") or {})},
            "add_generation_prompt": data["add_generation_prompt"],
            "continue_final_message": data["continue_final_message"],
        }
