"""Structured outputs as requests say them, turned into the job's one grammar (`Structured`).

Chat's `response_format`, Responses' `text.format`, vLLM's `structured_outputs` (json, regex,
choice, grammar) and a forcing `tool_choice` ("required" or a named function) all end up as
`JobParams.structured`, which the worker compiles and enforces (a forced call in the model's own
tool-call syntax); `tool_choice: "none"` bans the model's tool-call markers instead. Only one of them may constrain a request. Schemas are bounded here
(size, nesting) so a hostile one is a 400 before any worker sees it; what the grammar backend
cannot handle is a 400 from the worker that names the part.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

from rest_framework import serializers

from protocol import JobParams, Structured

STRUCTURED_OUTPUT_KEYS = ("json", "regex", "choice", "grammar")
MAX_PATTERN_CHARS = 4096
MAX_GRAMMAR_CHARS = 64 * 1024
MAX_CHOICES = 256


def _invalid(path: str, message: str) -> serializers.ValidationError:
    return serializers.ValidationError({path: [message]})


def _nesting(value, path: str) -> Iterator[tuple[int, str]]:
    """(depth, path) of every container in a JSON value, iteratively (no recursion limit to hit)."""
    stack = [(value, path, 1)]
    while stack:
        node, where, depth = stack.pop()
        yield depth, where
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]", depth + 1))


def check_schema(schema, path: str, context: dict) -> dict:
    """A JSON schema object within the size and nesting limits; the error names where it breaks them."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise _invalid(path, "The schema must be a JSON object.")
    size, limit = len(json.dumps(schema)), context.get("max_schema_bytes", 64 * 1024)
    if size > limit:
        raise _invalid(path, f"The schema is {size} bytes of JSON; at most {limit} are allowed.")
    depth_limit = context.get("max_schema_depth", 32)
    for depth, where in _nesting(schema, path):
        if depth > depth_limit:
            raise _invalid(path, f"The schema nests deeper than {depth_limit} levels (at {where}).")
    return schema


class ResponseFormatField(serializers.Field):
    """OpenAI's response_format: text, json_object or json_schema {name, schema, strict, description}."""

    def to_internal_value(self, data):
        kind = data.get("type") if isinstance(data, dict) else None
        if kind in ("text", "json_object"):
            return {"type": kind}
        if kind == "json_schema":
            spec = data.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise serializers.ValidationError('json_schema needs {"name": ..., "schema": {...}}.')
            unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
            if unknown:
                raise serializers.ValidationError(f"Unrecognized json_schema key: {unknown[0]}")
            schema = check_schema(spec.get("schema", {"type": "object"}), "json_schema.schema", self.context)
            return {"type": kind, "json_schema": {**spec, "schema": schema}}
        raise serializers.ValidationError('response_format type must be "text", "json_object" or "json_schema".')

    def to_representation(self, value):
        return value


class StructuredOutputsField(serializers.Field):
    """vLLM's structured_outputs: exactly one of json (a schema), regex, choice or grammar."""

    def to_internal_value(self, data) -> Structured:
        if not isinstance(data, dict):
            raise serializers.ValidationError("structured_outputs must be an object.")
        unknown = sorted(set(data) - set(STRUCTURED_OUTPUT_KEYS))
        if unknown:
            raise serializers.ValidationError(f"Unsupported structured_outputs key: {unknown[0]} "
                                              f"(supported: {', '.join(STRUCTURED_OUTPUT_KEYS)}).")
        given = [key for key in STRUCTURED_OUTPUT_KEYS if data.get(key) is not None]
        if len(given) != 1:
            raise serializers.ValidationError("structured_outputs needs exactly one of json, regex, choice, grammar.")
        key, value = given[0], data[given[0]]
        if key == "json":
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError as exc:
                    raise serializers.ValidationError(f"structured_outputs.json is not JSON: {exc}") from None
            return {"type": "json_schema", "schema": check_schema(value, "json", self.context)}
        if key == "choice":
            if (not isinstance(value, list) or not value or len(value) > MAX_CHOICES
                    or not all(isinstance(c, str) and c for c in value)):
                raise serializers.ValidationError(f"structured_outputs.choice must be 1 to {MAX_CHOICES} non-empty strings.")
            return {"type": "choice", "choices": value}
        limit = MAX_PATTERN_CHARS if key == "regex" else MAX_GRAMMAR_CHARS
        if not isinstance(value, str) or not value or len(value) > limit:
            raise serializers.ValidationError(f"structured_outputs.{key} must be a non-empty string of at most {limit} characters.")
        return {"type": "regex", "pattern": value} if key == "regex" else {"type": "grammar", "grammar": value}

    def to_representation(self, value):
        return value


def forced_tool_call(tool_choice, tools: list[dict], context: dict, parallel: bool = False) -> Structured | None:
    """tool_choice "required" (one call; one or more when parallel_tool_calls is sent true, as vLLM's) or a
    named function (one call of it), with valid arguments."""
    if tool_choice == "required":
        chosen = [tool["function"] for tool in tools]
    elif isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or tool_choice)["name"]  # Chat's shape, or Responses' flat one
        chosen = [tool["function"] for tool in tools if tool["function"]["name"] == name]
    else:
        return None
    return {"type": "tool_call", "many": tool_choice == "required" and parallel, "tools": [
        {"name": function["name"], "parameters": check_schema(function.get("parameters") or {"type": "object"},
                                                              f"tools[{function['name']}].parameters", context)}
        for function in chosen]}


def response_format_grammar(response_format: dict | None) -> Structured | None:
    if not response_format or response_format["type"] == "text":
        return None
    if response_format["type"] == "json_object":
        return {"type": "json_schema", "schema": {"type": "object"}}
    return {"type": "json_schema", "schema": response_format["json_schema"]["schema"]}


def output_grammar(attrs: dict, tools: list[dict], context: dict) -> Structured | None:
    """The request's one grammar, if any (a serializer's validate() stores it as attrs["structured"])."""
    candidates = {
        "response_format": response_format_grammar(attrs.get("response_format")),
        "structured_outputs": attrs.get("structured_outputs"),
        "tool_choice": forced_tool_call(attrs.get("tool_choice"), tools, context,
                                        attrs.get("parallel_tool_calls") is True) if tools else None,
    }
    given = [name for name, grammar in candidates.items() if grammar is not None]
    if len(given) > 1:
        raise _invalid(given[1], f"{given[0]} and {given[1]} cannot both constrain the output; send one.")
    return candidates[given[0]] if given else None


def constrain(params: JobParams, data: dict) -> JobParams:
    """Put the validated grammar into the job."""
    params.structured = data.get("structured")
    return params


def parsed_answer(params: JobParams, data: dict, tools: list[dict]) -> JobParams:
    """A chat answer's grammar and parsing (chat and Responses): its reasoning split off, its tool calls read
    when tools are given and tool_choice is not "none" (which bans the model's call markers instead)."""
    params = constrain(params, data)
    params.parse_output = True
    params.parse_tools = bool(tools) and data.get("tool_choice") != "none"
    params.ban_tool_calls = bool(tools) and data.get("tool_choice") == "none"
    params.parallel_tool_calls = data.get("parallel_tool_calls") is not False
    return params
