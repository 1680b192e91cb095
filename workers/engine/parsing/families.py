"""Each family's markers and call syntax, written from its documented format (and named as vLLM names it).

A call syntax reads one tool-call region's body into [(name, arguments JSON)], or None when the body
is not calls (then the region stays in the content as text). Arguments the format writes as text
(XML-ish parameters) take the type the tool's JSON schema gives the parameter.
"""
from __future__ import annotations

import ast
import json
import re

from .regions import Region, TextFormat

THINK = Region("reasoning", "<think>", "</think>")


def _dumps(arguments) -> str | None:
    """Arguments as OpenAI's JSON-object text; None when they are not an object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None
    return json.dumps(arguments, ensure_ascii=False) if isinstance(arguments, dict) else None


def _call(payload) -> tuple[str, str] | None:
    """{"name", "arguments" | "parameters"} as (name, arguments JSON)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        return None
    arguments = _dumps(payload.get("arguments", payload.get("parameters", {})))
    return None if arguments is None else (payload["name"], arguments)


def _calls(payloads) -> list[tuple[str, str]] | None:
    payloads = payloads if isinstance(payloads, list) else [payloads]
    calls = [_call(payload) for payload in payloads]
    return calls if calls and all(calls) else None


def _json_values(body: str) -> list:
    """Every JSON value in `body`, one after another (separated by whitespace, `;` or `,`); ValueError if any is not."""
    decoder, values, position = json.JSONDecoder(), [], 0
    while True:
        while position < len(body) and body[position] in " \t\r\n;,":
            position += 1
        if position >= len(body):
            return values
        value, position = decoder.raw_decode(body, position)
        values.append(value)


def json_calls(body: str, schemas: dict) -> list[tuple[str, str]] | None:
    """One JSON call object, a list of them, or several in a row (Hermes, Llama 3, Granite, Mistral's v3)."""
    values = _json_values(body)
    flat = [item for value in values for item in (value if isinstance(value, list) else [value])]
    return _calls(flat) if flat else None


def _typed(value: str, name: str, key: str, schemas: dict):
    """A parameter written as text, as the type the tool's schema gives it (a string stays text)."""
    schema = ((schemas.get(name) or {}).get("properties") or {}).get(key) or {}
    types = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    if "string" in types and len(types) == 1:
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def qwen3_coder_calls(body: str, schemas: dict) -> list[tuple[str, str]] | None:
    calls = []
    for match in FUNCTION.finditer(body):
        name = match.group(1).strip()
        arguments = {key.strip(): _typed(value, name, key.strip(), schemas)
                     for key, value in PARAMETER.findall(match.group(2))}
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    return calls or None


ARG_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)(?:</arg_value>|$)", re.DOTALL)


def glm45_calls(body: str, schemas: dict) -> list[tuple[str, str]] | None:
    name, _, rest = body.partition("<arg_key>")
    name = name.strip()
    if not name or "\n" in name or " " in name:
        return None
    arguments = {key.strip(): _typed(value, name, key.strip(), schemas) for key, value in ARG_PAIR.findall("<arg_key>" + rest)}
    return [(name, json.dumps(arguments, ensure_ascii=False))]


def _literal(node: ast.AST):
    """A Python literal, with JSON's true/false/null allowed too (models mix them)."""
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    if isinstance(node, ast.List):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(key): _literal(value) for key, value in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def pythonic_calls(body: str, schemas: dict) -> list[tuple[str, str]] | None:
    """`[f(a=1), g(b="x")]` (or one call without brackets): keyword arguments only."""
    if len(body) > 100_000:
        return None
    tree = ast.parse(body.strip(), mode="eval").body
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, (ast.Name, ast.Attribute)):
            return None
        name = ast.unparse(node.func)
        arguments = {keyword.arg: _literal(keyword.value) for keyword in node.keywords if keyword.arg}
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    return calls or None


MISTRAL_NAMED = re.compile(r"^\s*([\w.\-]+)\s*(?:\[CALL_ID\]\s*\w+\s*)?\[ARGS\]", re.DOTALL)


def mistral_calls(body: str, schemas: dict) -> list[tuple[str, str]] | None:
    """After [TOOL_CALLS]: a JSON list (v3 tokenizers), or name[ARGS]{…} per call (v11+), more [TOOL_CALLS] between."""
    calls = []
    for segment in filter(str.strip, body.split("[TOOL_CALLS]")):
        named = MISTRAL_NAMED.match(segment)
        if named:
            arguments = _dumps(segment[named.end():].strip())
            if arguments is None:
                return None
            calls.append((named.group(1), arguments))
            continue
        found = json_calls(segment, schemas)
        if found is None:
            return None
        calls.extend(found)
    return calls or None


DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)(?:<｜tool▁call▁end｜>|$)", re.DOTALL)
DS_FENCED = re.compile(r"^\s*([^\n]+?)\s*\n```(?:json)?\s*\n?(.*?)\n?```\s*$", re.DOTALL)


def deepseek_calls(body: str, schemas: dict) -> list[tuple[str, str]] | None:
    """V3's `function<｜tool▁sep｜>NAME` + a fenced JSON block, or V3.1's `NAME<｜tool▁sep｜>{…}`."""
    calls = []
    for raw in DS_CALL.findall(body):
        head, sep, rest = raw.partition("<｜tool▁sep｜>")
        if not sep:
            return None
        fenced = DS_FENCED.match(rest) if head.strip() == "function" else None
        name, arguments = (fenced.group(1), fenced.group(2)) if fenced else (head.strip(), rest)
        arguments = _dumps(arguments.strip())
        if arguments is None or not name:
            return None
        calls.append((name.strip(), arguments))
    return calls or None


KIMI_CALL = re.compile(r"<\|tool_call_begin\|>\s*(?:functions\.)?([\w.\-]+?)(?::\d+)?\s*<\|tool_call_argument_begin\|>"
                       r"(.*?)(?:<\|tool_call_end\|>|$)", re.DOTALL)


def kimi_calls(body: str, schemas: dict) -> list[tuple[str, str]] | None:
    calls = []
    for name, raw in KIMI_CALL.findall(body):
        arguments = _dumps(raw.strip())
        if arguments is None:
            return None
        calls.append((name, arguments))
    return calls or None


GEMMA_STRING = re.compile(r'<\|"\|>(.*?)<\|"\|>', re.DOTALL)
GEMMA_KEY = re.compile(r'(?<=[{,])\s*([A-Za-z_][\w\-]*)\s*:')


def gemma_value(text: str):
    """Gemma 4's argument object: keys unquoted, strings between <|"|> marks; JSON otherwise."""
    strings: list[str] = []

    def hold(match: re.Match) -> str:
        strings.append(match.group(1))
        return f"\x00{len(strings) - 1}\x00"

    quoted = GEMMA_KEY.sub(lambda m: json.dumps(m.group(1)) + ":", GEMMA_STRING.sub(hold, text))
    restored = re.sub(r"\x00(\d+)\x00", lambda m: json.dumps(strings[int(m.group(1))], ensure_ascii=False), quoted)
    return json.loads(restored)


GEMMA_CALL = re.compile(r"^\s*call:([\w.\-]+)\s*(\{.*\})\s*$", re.DOTALL)


def gemma4_calls(body: str, schemas: dict) -> list[tuple[str, str]] | None:
    match = GEMMA_CALL.match(body)
    if not match:
        return None
    arguments = _dumps(gemma_value(match.group(2)))
    return None if arguments is None else [(match.group(1), arguments)]


# --- the formats, by vLLM's parser names ------------------------------------------------------------
TOOL_FORMATS: dict[str, TextFormat] = {
    "hermes": TextFormat((Region("tool", "<tool_call>", "</tool_call>"),), json_calls),
    "qwen3_coder": TextFormat((Region("tool", "<tool_call>", "</tool_call>"),), qwen3_coder_calls),
    "llama3_json": TextFormat((Region("tool", "<|python_tag|>"), Region("tool", "{", at_start=True, keep_open=True)),
                              json_calls, drop=("<|eom_id|>", "<|eot_id|>")),
    "pythonic": TextFormat((Region("tool", "[", at_start=True, keep_open=True),), pythonic_calls),
    "llama4_pythonic": TextFormat((Region("tool", "<|python_start|>", "<|python_end|>"),
                                   Region("tool", "[", at_start=True, keep_open=True)), pythonic_calls,
                                  drop=("<|eom|>", "<|eot|>")),
    "mistral": TextFormat((Region("tool", "[TOOL_CALLS]"),), mistral_calls),
    "deepseek_v3": TextFormat((Region("tool", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),), deepseek_calls,
                              drop=("<｜end▁of▁sentence｜>",)),
    "granite": TextFormat((Region("tool", "<|tool_call|>"), Region("tool", "<tool_call>")), json_calls),
    "gemma4": TextFormat((Region("tool", "<|tool_call>", "<tool_call|>"),), gemma4_calls,
                         drop=("<turn|>", "<eos>")),
    "kimi_k2": TextFormat((Region("tool", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),), kimi_calls,
                          drop=("<|im_end|>",)),
    "glm45": TextFormat((Region("tool", "<tool_call>", "</tool_call>"),), glm45_calls,
                        drop=("<|user|>", "<|observation|>")),
}
TOOL_FORMATS["deepseek_v31"] = TOOL_FORMATS["deepseek_v3"]

REASONING_FORMATS: dict[str, TextFormat] = {
    "qwen3": TextFormat((THINK,)),
    "deepseek_r1": TextFormat((THINK,), starts_in_reasoning=True),
    "glm45": TextFormat((THINK,)),
    "mistral": TextFormat((Region("reasoning", "[THINK]", "[/THINK]"),)),
    "granite": TextFormat((Region("reasoning", "Here is my thought process:", "Here is my response:"),)),
    "gemma4": TextFormat((Region("reasoning", "<|channel>thought", "<channel|>"),)),
}
