"""`POST /v1/responses` request: input items turned into the chat messages the worker's template renders.

With `previous_response_id`, the view hands the stored turns to `continue_from()` once it has
read them (openai_api.response_store), and they come before this request's input.
"""
from __future__ import annotations

import re

from rest_framework import serializers

from protocol import Conversation, JobParams, to_job_params

from .content import BARE_INPUT_PART_TYPES, invalid
from .conversation import TemplateKwargsField, clean_message, clean_tool
from .fields import RejectUnknownFieldsMixin, StrictBooleanField, StrictCharField, StrictIntegerField
from .openai_params import ResponsesOpenAIParamsSerializer, thinking_kwargs, usage_tags
from .sampling import SamplingParamsSerializer, first_given
from .structured import ResponseFormatField, output_grammar, parsed_answer

INPUT_ROLES = ("user", "system", "developer", "assistant")


def _text(content, path: str) -> str | list:
    if isinstance(content, (str, list)):
        return content
    raise invalid(path, "content must be a string or a list of input_text parts.")


def _reasoning_text(item: dict) -> str:
    parts = (item.get("content") or []) + (item.get("summary") or [])
    return "\n".join(p.get("text", "") for p in parts if isinstance(p, dict))


Origin = tuple[str, str]  # where a chat message came from: (its item's path, the path of its content there)
MESSAGE_PATH = re.compile(r"messages\[(\d+)\](\.content)?")


def responses_paths(text: str, origins: list[Origin]) -> str:
    """`text` (an error's param or message) with each chat message path (`messages[1].content[0]`, as the
    worker and the message checks name them) turned into the Responses field it came from (`input[0].content[0]`)."""
    def origin(match: re.Match) -> str:
        index = int(match.group(1))
        if index >= len(origins):
            return match.group(0)
        item, content = origins[index]
        return content if match.group(2) else item

    return MESSAGE_PATH.sub(origin, text)


def input_messages(items, instructions: str | None, prior: int = 0) -> tuple[list[dict], list[Origin]]:
    """Responses input (a string or items) as chat messages: function calls and outputs become tool turns;
    and for each message, where it came from (`prior` items first are the stored turns of
    previous_response_id). Errors in the messages name the Responses fields."""
    messages: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    origins: list[Origin] = [("instructions", "instructions")] if instructions else []
    if isinstance(items, str):
        return _cleaned([*messages, {"role": "user", "content": items}], [*origins, ("input", "input")])
    if not isinstance(items, list) or not items:
        raise invalid("input", "input must be a string or a non-empty list of items.")
    reasoning = None
    for index, item in enumerate(items):
        path = f"input[{index - prior}]" if index >= prior else "previous_response_id"
        count = len(messages)
        if not isinstance(item, dict):
            raise invalid(path, "each input item must be an object.")
        kind = item.get("type", "message")
        if kind in BARE_INPUT_PART_TYPES:  # a content part outside a message: the user's, with its neighbours
            previous = messages[-1] if messages else None
            if previous is not None and previous.get("bare_parts"):
                previous["content"].append(item)
            else:
                messages.append({"role": "user", "content": [item], "bare_parts": True})
        elif kind == "message":
            if item.get("role") not in INPUT_ROLES:
                raise invalid(f"{path}.role", f"role must be one of {', '.join(INPUT_ROLES)}.")
            message = {"role": item["role"], "content": _text(item.get("content"), f"{path}.content")}
            if item["role"] == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            messages.append(message)
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise invalid(path, "a function_call item needs call_id, name and arguments (strings).")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            previous = messages[-1] if messages else None
            if previous and previous["role"] == "assistant" and previous.get("tool_calls"):
                previous["tool_calls"].append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning is not None:
                    message["reasoning_content"], reasoning = reasoning, None
                messages.append(message)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), (str, list)):
                raise invalid(path, "a function_call_output item needs call_id and output.")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        elif kind == "reasoning":
            reasoning = _reasoning_text(item)
        else:
            raise invalid(f"{path}.type", f"input item type {kind!r} is not supported.")
        if len(messages) > count:
            content = path if index < prior else f"{path}.output" if kind == "function_call_output" else f"{path}.content"
            origins.append((path, content))
    for message in messages:
        message.pop("bare_parts", None)
    return _cleaned(messages, origins)


def _cleaned(messages: list[dict], origins: list[Origin]) -> tuple[list[dict], list[Origin]]:
    try:
        return [clean_message(message, index) for index, message in enumerate(messages)], origins
    except serializers.ValidationError as exc:
        raise serializers.ValidationError(_renamed(exc.detail, origins)) from None


def _renamed(detail, origins: list[Origin]):
    if isinstance(detail, dict):
        return {responses_paths(str(key), origins): _renamed(value, origins) for key, value in detail.items()}
    if isinstance(detail, list):
        return [_renamed(item, origins) for item in detail]
    return responses_paths(str(detail), origins)


def chat_tool(tool, index: int) -> dict:
    """Responses' flat function tool {"type", "name", "parameters", ...} in Chat Completions' shape."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise invalid(f"tools[{index}]", f"only function tools are supported, not {kind!r}.")
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
    return clean_tool({"type": "function", "function": function}, index)


def input_items(items) -> list[dict]:
    """This turn's input as items (a string is one user message), as GET .../input_items lists them."""
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": items}]}]
    return [dict(item) for item in items]


class ResponsesRequestSerializer(RejectUnknownFieldsMixin, ResponsesOpenAIParamsSerializer, SamplingParamsSerializer):
    input = serializers.JSONField()
    instructions = StrictCharField(required=False, allow_null=True, allow_blank=True)
    max_output_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1)
    tools = serializers.JSONField(required=False, allow_null=True)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    parallel_tool_calls = StrictBooleanField(required=False, allow_null=True)
    previous_response_id = StrictCharField(required=False, allow_null=True, max_length=100)
    text = serializers.JSONField(required=False, allow_null=True)
    chat_template_kwargs = TemplateKwargsField(required=False, allow_null=True)

    def validate(self, attrs: dict) -> dict:
        if attrs.get("store") is None:
            attrs["store"] = True  # OpenAI's default
        if attrs.get("background"):
            if not attrs["store"]:
                raise invalid("background", "background responses must be stored: store cannot be false.")
            if attrs.get("stream"):
                raise invalid("background", "background and stream together are not supported: poll "
                              "GET /v1/responses/{id} instead.")
        if attrs.get("conversation") is not None and attrs.get("previous_response_id"):
            raise invalid("conversation", "Send conversation or previous_response_id, not both.")
        if attrs.get("n", 1) != 1:
            raise invalid("n", "The Responses API returns one output; n must be 1.")
        self.check_min_tokens(attrs, first_given(attrs, "max_output_tokens", "max_new_tokens"))
        self.common(attrs)
        attrs["messages"], attrs["message_origins"] = input_messages(attrs["input"], attrs.get("instructions"))
        attrs["input_items"] = input_items(attrs["input"])
        tools = attrs.get("tools") or []
        if not isinstance(tools, list):
            raise invalid("tools", "tools must be a list.")
        attrs["chat_tools"] = [chat_tool(tool, index) for index, tool in enumerate(tools)]
        self._validate_tool_choice(attrs)
        text_format = (attrs.get("text") or {}).get("format") if isinstance(attrs.get("text"), dict) else None
        if attrs.get("text") is not None and not isinstance(attrs["text"], dict):
            raise invalid("text", 'text must be {"format": {...}}.')
        if text_format is not None:
            if not isinstance(text_format, dict):
                raise invalid("text.format", 'format type must be "text", "json_object" or "json_schema".')
            schema = {k: v for k, v in text_format.items() if k != "type"}
            shaped = {"type": text_format.get("type"), "json_schema": schema} if schema else text_format
            field = ResponseFormatField()
            field._context = self.context  # the schema limits
            try:
                attrs["response_format"] = field.to_internal_value(shaped)
            except serializers.ValidationError as exc:
                raise serializers.ValidationError({"text.format": exc.detail}) from None
        attrs["structured"] = output_grammar(attrs, attrs["chat_tools"], self.context)
        return attrs

    @staticmethod
    def _validate_tool_choice(attrs: dict) -> None:
        choice, names = attrs.get("tool_choice"), {t["function"]["name"] for t in attrs["chat_tools"]}
        if choice in (None, "none", "auto"):
            return
        if choice == "required":
            if not names:
                raise invalid("tool_choice", 'tool_choice "required" needs tools.')
            return
        if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
            if choice["name"] not in names:
                raise invalid("tool_choice", f"tool_choice names function {choice['name']!r}, which is not in tools.")
            return
        raise invalid("tool_choice", 'tool_choice must be "none", "auto", "required" or {"type": "function", "name"}.')

    def continue_from(self, prior_items: list[dict]) -> None:
        """Put the stored turns (previous input and output items) before this request's input."""
        data = self.validated_data
        data["prior_items"] = prior_items
        data["messages"], data["message_origins"] = input_messages(
            [*prior_items, *data["input_items"]], data.get("instructions"), prior=len(prior_items))

    def in_responses_terms(self, error):
        """A worker's error (an unreadable image names `messages[1].content[0]`) as this request's fields."""
        origins = self.validated_data["message_origins"]
        error.message = responses_paths(error.message, origins)
        error.param = responses_paths(error.param, origins) if error.param else error.param
        return error

    @property
    def logprobs(self) -> int | None:
        """Top alternatives per output token, when `include` asks for output_text logprobs."""
        data = self.validated_data
        if "message.output_text.logprobs" in (data.get("include") or ()):
            return data.get("top_logprobs") or 0
        return None

    def job_prompts(self) -> list[Conversation]:
        data = self.validated_data
        kwargs = thinking_kwargs((data.get("reasoning") or {}).get("effort"))
        if data.get("response_format"):
            kwargs["response_format"] = data["response_format"]
        conversation: Conversation = {
            "messages": data["messages"], "tools": data["chat_tools"] or None,
            "chat_template_kwargs": {**kwargs, **(data.get("chat_template_kwargs") or {})},
            "add_generation_prompt": True, "continue_final_message": False}
        if data.get("truncation") == "auto":
            conversation["truncate_to_fit"] = True
        return [conversation]

    def job_field_names(self) -> dict[str, str]:
        """The job's `prompt` and `max_tokens` as Responses calls them (in the worker's errors)."""
        return {"prompt": "input", "max_tokens": "max_output_tokens"}

    def job_params(self) -> JobParams:
        data = self.validated_data
        params = to_job_params(data, max_tokens=first_given(data, "max_output_tokens", "max_new_tokens"),
                               logprobs=self.logprobs)
        return parsed_answer(params, data, data["chat_tools"])

    def usage_tags(self) -> dict:
        return usage_tags(self.validated_data)
