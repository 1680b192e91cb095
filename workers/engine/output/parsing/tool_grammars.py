"""tool_choice "required" / a named function as a grammar in the model's own tool-call syntax.

The web side asks for `{"type": "tool_call", "tools": [{"name", "parameters"}], "many": bool}`; the
worker adds the model's `syntax` (its tool parser) and compiles the Lark grammar below with llguidance:
the family's markers (as their tokens where the tokenizer has them), the function's name, and its
arguments as the schema allows (`%json`; parameters a format writes as text take a text pattern).
`many` (parallel_tool_calls, tool_choice "required") allows one or more calls, else exactly one.
"""
from __future__ import annotations

import json

from protocol import Structured

JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: a weak model cannot wander in whitespace
TEXT_VALUE = "/[^<\\n]+/"  # a parameter written as text: one line, up to the next marker
NL = "\n"
ONE_CALL_SYNTAXES = {"openai"}  # Harmony ends the answer at <|call|>: one call per turn


def in_family_syntax(structured: Structured, fmt, open_reasoning: str | None = None) -> Structured:
    """A tool_call grammar spec with the model's syntax in it (it is part of the grammar's cache key);
    `open_reasoning`: the marker that closes the reasoning the prompt opened, written before the call."""
    syntax = "hermes" if fmt is None or fmt.response_template is not None else fmt.tool_parser
    if syntax == "mistral" and fmt.mistral_named:
        syntax = "mistral_named"
    return {**structured, "syntax": syntax, **({"prefix": open_reasoning} if open_reasoning else {})}


def banned_markers(fmt) -> list[str]:
    """What opens a tool call in the model's format (tool_choice "none" bans it); none where a call
    opens with ordinary text (llama3's "{", pythonic's "[") or the template says (response_template)."""
    from .families import TOOL_FORMATS

    tool_format = TOOL_FORMATS.get(fmt.tool_parser) if fmt is not None else TOOL_FORMATS["hermes"]
    return [region.open for region in (tool_format.regions if tool_format else ()) if not region.at_start]


class LarkText:
    """Lark text for one tokenizer: markers as their tokens, the rest as quoted text."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)

    def text(self, value: str) -> str:
        """`value` as a sequence of Lark items, each added token in it as `<[id]>`."""
        items, rest = [], value
        while rest:
            found = min(((rest.find(token), token) for token in self.added if token and token in rest),
                        default=None, key=lambda hit: (hit[0], -len(hit[1])))
            if found is None:
                items.append(json.dumps(rest))
                break
            index, token = found
            if index:
                items.append(json.dumps(rest[:index]))
            items.append(f"<[{self.tokenizer.convert_tokens_to_ids(token)}]>")
            rest = rest[index + len(token):]
        return " ".join(items) if items else '""'


def _json(schema: dict) -> str:
    return "%json " + json.dumps({**(schema or {"type": "object"}), "x-guidance": JSON_OPTIONS})


def _is_text(schema: dict) -> bool:
    return (schema or {}).get("type") == "string" and not {"enum", "const", "pattern", "format"} & set(schema)


def _value(schema: dict) -> str:
    """A parameter's value: as text where the format writes strings bare (minLength to maxLength), else JSON."""
    if not _is_text(schema):
        return _json(schema)
    least, most = schema.get("minLength"), schema.get("maxLength")
    least = max(int(least), 1) if isinstance(least, int) else 1
    if isinstance(most, int) and most >= least:
        return f"/[^<\\n]{{{least},{int(most)}}}/"
    return f"/[^<\\n]{{{least},}}/" if least > 1 else TEXT_VALUE


def _required(parameters: dict) -> list[tuple[str, dict]]:
    """The parameters a call must give, in the schema's order (optional ones are left out of forced calls)."""
    properties = (parameters or {}).get("properties") or {}
    required = set((parameters or {}).get("required") or ())
    return [(key, schema if isinstance(schema, dict) else {}) for key, schema in properties.items() if key in required]


def _call_rule(syntax: str, tool: dict, lark: LarkText) -> str:
    """One call of `tool` in `syntax`, as a Lark expression."""
    name, parameters = tool["name"], tool.get("parameters") or {"type": "object"}
    t = lark.text
    if syntax == "hermes":
        body = {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                "properties": {"name": {"const": name}, "arguments": parameters}}
        return f'{t("<tool_call>")} "\\n" {_json(body)} "\\n" {t("</tool_call>")}'
    if syntax == "llama3_json":
        body = {"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
                "properties": {"name": {"const": name}, "parameters": parameters}}
        return _json(body)
    if syntax in ("mistral", "granite"):
        item = {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                "properties": {"name": {"const": name}, "arguments": parameters}}
        return _json(item)
    if syntax == "mistral_named":
        return f'{t("[TOOL_CALLS]" + name + "[ARGS]")} {_json(parameters)}'
    if syntax in ("pythonic", "llama4_pythonic"):
        arguments = ' ", " '.join(f'{json.dumps(key + "=")} {_json(schema)}' for key, schema in _required(parameters))
        return f'{json.dumps(name + "(")} {arguments} ")"'
    if syntax == "qwen3_coder":
        params = " ".join(f'{t(f"<parameter={key}>")} "\\n" {_value(schema)} '
                          f'"\\n" {t("</parameter>")} "\\n"' for key, schema in _required(parameters))
        opening, closing = t(NL.join(("<tool_call>", f"<function={name}>", ""))), t(NL.join(("</function>", "</tool_call>")))
        return f"{opening} {params} {closing}"
    if syntax == "glm45":
        params = " ".join(f'{t(f"<arg_key>{key}</arg_key>")} "\\n" {t("<arg_value>")} '
                          f'{_value(schema)} {t("</arg_value>")} "\\n"'
                          for key, schema in _required(parameters))
        return f'{t("<tool_call>")} {json.dumps(name + NL)} {params} {t("</tool_call>")}'
    if syntax == "gemma4":
        quote = t('<|"|>')
        params = ' "," '.join(f'{json.dumps(key + ":")} ' + (f"{quote} {_value(schema)} {quote}" if _is_text(schema) else _json(schema))
                              for key, schema in _required(parameters))
        return f'{t("<|tool_call>")} {json.dumps("call:" + name + "{")} {params} "}}" {t("<tool_call|>")}'
    if syntax == "deepseek_v3":
        return (f'{t("<｜tool▁call▁begin｜>function<｜tool▁sep｜>")} {json.dumps(name + NL + "```json" + NL)} '
                f'{_json(parameters)} "\\n```" {t("<｜tool▁call▁end｜>")}')
    if syntax == "deepseek_v31":
        return f'{t("<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>")} {_json(parameters)} {t("<｜tool▁call▁end｜>")}'
    if syntax == "kimi_k2":
        return (f'{t("<|tool_call_begin|>functions." + name + ":")} /[0-9]{{1,3}}/ {t("<|tool_call_argument_begin|>")} '
                f'{_json(parameters)} {t("<|tool_call_end|>")}')
    if syntax == "openai":
        return (f'{t("<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>")} '
                f'{_json(parameters)} {t("<|call|>")}')
    raise ValueError(f"no tool-call grammar for {syntax!r}")


# (what comes before the calls, between two of them, after them)
WRAPPERS = {
    "deepseek_v3": ("<｜tool▁calls▁begin｜>", "\n", "<｜tool▁calls▁end｜>"),
    "deepseek_v31": ("<｜tool▁calls▁begin｜>", "", "<｜tool▁calls▁end｜>"),
    "kimi_k2": ("<|tool_calls_section_begin|>", "", "<|tool_calls_section_end|>"),
    "pythonic": ("[", ", ", "]"),
    "llama4_pythonic": ("[", ", ", "]"),
    "mistral": ("[TOOL_CALLS][", ", ", "]"),
    "granite": ("<|tool_call|>[", ", ", "]"),
    "llama3_json": ("", "; ", ""),
}


def tool_call_grammar(spec: dict, tokenizer) -> str:
    """The Lark grammar of a tool_call spec, in its `syntax` (Hermes where none is named)."""
    syntax = spec.get("syntax") or "hermes"
    lark = LarkText(tokenizer)
    alternatives = " | ".join(f"call_{index}" for index in range(len(spec["tools"])))
    rules = [f"call_{index}: {_call_rule(syntax, tool, lark)}" for index, tool in enumerate(spec["tools"])]
    before, between, after = WRAPPERS.get(syntax, ("", "\n", ""))
    many = spec.get("many") and syntax not in ONE_CALL_SYNTAXES
    repeat = f" ({lark.text(between) if between else ''} call)*" if many else ""
    start = " ".join(item for item in (lark.text(spec["prefix"]) if spec.get("prefix") else "",
                                       lark.text(before) if before else "", "call" + repeat,
                                       lark.text(after) if after else "") if item)
    return "\n".join([f"start: {start}", f"call: {alternatives}", *rules])
