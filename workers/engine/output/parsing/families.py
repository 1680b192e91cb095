"""Each family's markers and call syntax, written from its documented format (and named as vLLM names it).

A call syntax reads a tool-call region's body as it arrives (a generator over reading.CallReader): a
call opens once its name is read, then its arguments stream. Formats that write arguments as JSON pass
them on as written; the others (XML-ish parameters, Python calls, Gemma 4's) are translated into a JSON
object as they come: string values stream, a value of another type (by the tool's JSON schema) goes
out once it is whole.
"""
from __future__ import annotations

import ast
import json
import re

from .reading import NAME_LIMIT, NAME_TEXT, WHITESPACE, CallReader, NotCalls
from .regions import Region, TextFormat

THINK = Region("reasoning", "<think>", "</think>")


def _dumps(arguments) -> str | None:
    """Arguments as OpenAI's JSON-object text (from JSON text, or a JSON string holding it); None when they
    are not an object."""
    for _ in range(2):
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                return None
    return json.dumps(arguments, ensure_ascii=False) if isinstance(arguments, dict) else None


def _is_text(name: str | None, key: str, schemas: dict) -> bool:
    """Whether the tool's schema gives the parameter only the string type (written as text, streamed)."""
    schema = ((schemas.get(name or "") or {}).get("properties") or {}).get(key.strip()) or {}
    types = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    return types == ["string"]


def _typed(value: str, name: str | None, key: str, schemas: dict):
    """A parameter written as text, as the type the tool's schema gives it (a string stays text)."""
    if _is_text(name, key, schemas):
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def _literal(node: ast.AST):
    """A Python literal, with JSON's true/false/null allowed too (models mix them)."""
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    if isinstance(node, ast.List):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(key): _literal(value) for key, value in zip(node.keys, node.values)}
    return ast.literal_eval(node)


GEMMA_QUOTE = '<|"|>'
GEMMA_STRING = re.compile(r'<\|"\|>(.*?)<\|"\|>', re.DOTALL)
GEMMA_KEY = re.compile(r'(?<=[{,])\s*([A-Za-z_][\w\-]*)\s*:')


def gemma_value(text: str):
    """Gemma 4's argument values: keys unquoted, strings between <|"|> marks; JSON otherwise."""
    strings: list[str] = []

    def hold(match: re.Match) -> str:
        strings.append(match.group(1))
        return f"\x00{len(strings) - 1}\x00"

    quoted = GEMMA_KEY.sub(lambda m: json.dumps(m.group(1)) + ":", GEMMA_STRING.sub(hold, text))
    restored = re.sub(r"\x00(\d+)\x00", lambda m: json.dumps(strings[int(m.group(1))], ensure_ascii=False), quoted)
    return json.loads(restored)


# --- reading calls as they arrive (workers/engine/output/parsing/reading.py) ------------------------------
def _text_value(r: CallReader, key: str, stops: tuple[str, ...]):
    """A translated string parameter, streamed as it comes; the marker that ended it (None: the text's end)."""
    r.key(key)
    r.arguments('"')
    _, marker = yield from r.until(stops, emit=r.string_piece)
    if marker is not None or r.closed:
        r.arguments('"')
    return marker


def _parameter(r: CallReader, key: str, stops: tuple[str, ...]):
    """A parameter written as text up to one of `stops`: streamed where the schema says string, else read
    whole and given its type; the marker that ended it (None: the text's end)."""
    if _is_text(r.name, key, r.schemas):
        return (yield from _text_value(r, key, stops))
    value, marker = yield from r.until(stops)
    if marker is not None or r.closed:
        r.key(key)
        r.arguments(json.dumps(_typed(value, r.name, key, r.schemas), ensure_ascii=False))
    return marker


def _end_or_fail(r: CallReader):
    """Where the syntax expects more of a call but the text ended: the call ends (closed if the region was)."""
    if not (yield from r.at_end()):
        raise NotCalls(r.text[r.pos:r.pos + 20])
    r.end_call(complete=r.closed)


def _json_arguments(r: CallReader, stops: tuple[str, ...]):
    """A call's arguments written as JSON (the call is open): an object streams as written; anything else
    is read whole up to a stop (a JSON string holding the object is unwrapped; nothing is `{}`)."""
    yield from r.skip()
    if (yield from r.peek()) == "{":
        yield from r.nested(stops=stops, emit=r.arguments)
        return
    value, marker = yield from r.until(stops)
    if marker is not None:
        r.unread(marker)
    elif not r.closed:
        return  # cut: the value may not be whole
    r.arguments(_dumps(value.strip()) or value.strip())


def json_objects(r: CallReader):
    """`{"name": …, "arguments" | "parameters": {…}}` objects, alone, in a list or several in a row
    (Hermes, Llama 3, Granite, Mistral's v3): the call opens at its name, its arguments stream as written."""
    while True:
        yield from r.skip(WHITESPACE + ";,[")
        if (yield from r.accept("]")):
            r.settle()
            continue
        if (yield from r.at_end()):
            return
        yield from _json_call(r)


def _json_call(r: CallReader):
    if not (yield from r.accept("{")):
        raise NotCalls(r.text[r.pos:r.pos + 20])
    name, arguments = None, None  # arguments: their text once read (or streamed)
    while True:
        yield from r.skip()
        if (yield from r.accept("}")):
            break
        if (yield from r.peek()) != '"':
            if (yield from r.at_end()) and name is not None:
                return  # cut inside the call
            raise NotCalls(r.text[r.pos:r.pos + 20])
        key = json.loads((yield from r.nested()))
        yield from r.skip()
        if not (yield from r.accept(":")):
            raise NotCalls(key)
        yield from r.skip()
        if key in ARGUMENT_KEYS and arguments is None and name is not None and (yield from r.peek()) == "{":
            arguments = yield from r.nested(emit=r.arguments)
        else:
            value = json.loads((yield from r.nested(ends=",}")))
            if key == "name" and name is None:
                if not isinstance(value, str):
                    raise NotCalls(key)
                name = value
                r.open(name)
                if arguments is not None:
                    r.arguments(arguments)
            elif key in ARGUMENT_KEYS and arguments is None:
                arguments = _dumps(value) or json.dumps(value, ensure_ascii=False)
                r.arguments(arguments)
        yield from r.skip()
        if not (yield from r.accept(",")):
            if (yield from r.accept("}")):
                break
            if (yield from r.at_end()) and name is not None:
                return  # cut inside the call
            raise NotCalls(r.text[r.pos:r.pos + 20])
    if name is None:
        raise NotCalls("no name")
    if arguments is None:
        r.arguments("{}")
    r.end_call()


ARGUMENT_KEYS = ("arguments", "parameters")


def qwen3_coder(r: CallReader):
    """`<function=NAME>` then `<parameter=KEY>\nVALUE\n</parameter>` per parameter, `</function>`."""
    stops = ("\n</parameter>", "</parameter>", "\n<parameter=", "<parameter=", "\n</function>", "</function>")
    while (yield from r.next_call("<function=")):
        yield from r.open_named((">",), translated=True)
        while True:
            yield from r.skip()
            if (yield from r.accept("</function>")):
                r.end_call()
                break
            if not (yield from r.accept("<parameter=")):
                return (yield from _end_or_fail(r))
            key, marker = yield from r.until((">",), allowed=NAME_TEXT, limit=NAME_LIMIT)
            if marker is None:
                return
            yield from r.accept("\n")
            marker = yield from _parameter(r, key, stops)
            if marker is not None and "</parameter>" not in marker:
                r.unread(marker.lstrip("\n"))  # the next parameter, or the function's end


def glm45(r: CallReader):
    """`NAME` then `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>` per parameter (one call per region)."""
    yield from r.skip()
    name, marker = yield from r.until(("\n", "<arg_key>"), allowed=NAME_TEXT, limit=NAME_LIMIT)
    if marker is None and not r.closed:
        raise NotCalls(name)
    r.open(name, translated=True)
    if marker == "<arg_key>":
        r.unread(marker)
    while True:
        yield from r.skip()
        if not (yield from r.accept("<arg_key>")):
            return (yield from _end_or_fail(r))
        key, marker = yield from r.until(("</arg_key>",), allowed=NAME_TEXT, limit=NAME_LIMIT)
        if marker is None:
            return
        yield from r.skip()
        if not (yield from r.accept("<arg_value>")):
            return (yield from _end_or_fail(r))
        yield from _parameter(r, key, ("</arg_value>",))


PY_QUOTES = (("\"", "\"", True), ("'", "'", True))
PY_NAME_TEXT = re.compile(r"\s*[\w.]*\s*")


def pythonic(r: CallReader):
    """`[f(a=1), g(b="x")]` (or one call bare): keyword arguments only, as JSON; string values stream."""
    yield from r.skip()
    listed = yield from r.accept("[")
    while True:
        yield from r.skip(WHITESPACE + ",")
        if listed and (yield from r.accept("]")):
            r.settle()
            yield from r.skip()
            if not (yield from r.at_end()):
                raise NotCalls("text after the calls")
            return
        if (yield from r.at_end()):
            return
        yield from r.open_named(("(",), PY_NAME_TEXT, translated=True)
        while True:
            yield from r.skip(WHITESPACE + ",")
            if (yield from r.accept(")")):
                r.end_call()
                break
            key, marker = yield from r.until(("=",), allowed=PY_NAME_TEXT, limit=NAME_LIMIT)
            if marker is None:
                return
            yield from r.skip()
            start = yield from r.peek(3)
            if start[:1] in ("'", '"') and start not in ("\'\'\'", '"""'):
                r.key(key)
                r.arguments('"')
                if (yield from r.python_string(r.string_piece)):
                    r.arguments('"')
                continue
            value = yield from r.nested(PY_QUOTES, ends=",)")
            if (yield from r.at_end()):
                return  # cut: the value may not be whole
            r.key(key)
            r.arguments(json.dumps(_literal(ast.parse(value.strip(), mode="eval").body), ensure_ascii=False))


GEMMA_QUOTES = ((GEMMA_QUOTE, GEMMA_QUOTE, False), ('"', '"', True))
GEMMA_KEY_TEXT = re.compile(r"\s*[A-Za-z_][\w\-]*\s*|\s*")


def gemma4(r: CallReader):
    """`call:NAME{key:<|"|>text<|"|>,n:1}`: strings stream, other values are read whole."""
    while (yield from r.next_call("call:")):
        yield from r.open_named(("{",), translated=True)
        while True:
            yield from r.skip(WHITESPACE + ",")
            if (yield from r.accept("}")):
                r.end_call()
                break
            if (yield from r.at_end()):
                return r.end_call(complete=r.closed)
            key, marker = yield from r.until((":",), allowed=GEMMA_KEY_TEXT, limit=NAME_LIMIT)
            if marker is None:
                return
            yield from r.skip()
            if (yield from r.accept(GEMMA_QUOTE)):
                yield from _text_value(r, key, (GEMMA_QUOTE,))
                continue
            value = yield from r.nested(GEMMA_QUOTES, ends=",}")
            if (yield from r.at_end()) and not r.closed:
                return  # cut: the value may not be whole
            r.key(key)
            r.arguments(json.dumps(gemma_value("{" + f"v:{value}" + "}")["v"], ensure_ascii=False))


def mistral(r: CallReader):
    """After [TOOL_CALLS]: a JSON list (v3 tokenizers), or `NAME[ARGS]{…}` per call (v11+), more
    [TOOL_CALLS] between."""
    while True:
        yield from r.skip(WHITESPACE + ",;")
        if (yield from r.accept("[TOOL_CALLS]")):
            continue
        char = yield from r.peek()
        if not char:
            return
        if char in "[]":
            r.pos += 1
            r.settle()
            continue
        if char == "{":
            yield from _json_call(r)
            continue
        if (yield from r.open_named(("[ARGS]", "[CALL_ID]"))) == "[CALL_ID]":
            _, marker = yield from r.until(("[ARGS]",), limit=NAME_LIMIT)
            if marker is None:
                return
        yield from _json_arguments(r, ("[TOOL_CALLS]",))
        r.end_call()


def marked_calls(begin: str, separator: str, end: str, name_of=str.strip, fenced: bool = False):
    """Calls each between `begin` and `end`: a header, `separator`, JSON arguments (DeepSeek's, Kimi's).
    `name_of` reads the name from the header; `fenced` (DeepSeek V3): a header `function` is followed by
    the name on its own line and the arguments in a ```json fence."""
    def syntax(r: CallReader):
        while (yield from r.next_call(begin)):
            header, marker = yield from r.until((separator,), allowed=HEADER_TEXT, limit=NAME_LIMIT)
            if marker is None:
                raise NotCalls(header)
            if fenced and header.strip() == "function":
                yield from r.open_named(("\n", "```"))
                yield from r.skip(WHITESPACE + "`")
                yield from r.accept("json")
            else:
                r.open(name_of(header))
            yield from _json_arguments(r, (end,))
            yield from r.skip(WHITESPACE + "`")
            if not (yield from r.accept(end)):
                return (yield from _end_or_fail(r))
            r.end_call()
    return syntax


HEADER_TEXT = re.compile(r"[\s\w.\-:]*")
KIMI_NAME = re.compile(r"^\s*(?:functions\.)?(.+?)(?::\d+)?\s*$")

deepseek = marked_calls("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", fenced=True)
kimi_k2 = marked_calls("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                       lambda header: (KIMI_NAME.match(header) or KIMI_NAME.match("-")).group(1))


# --- the formats, by vLLM's parser names ------------------------------------------------------------
TOOL_FORMATS: dict[str, TextFormat] = {
    "hermes": TextFormat((Region("tool", "<tool_call>", "</tool_call>"),), json_objects),
    "qwen3_coder": TextFormat((Region("tool", "<tool_call>", "</tool_call>"),), qwen3_coder),
    "llama3_json": TextFormat((Region("tool", "<|python_tag|>"), Region("tool", "{", at_start=True, keep_open=True)),
                              json_objects, drop=("<|eom_id|>", "<|eot_id|>")),
    "pythonic": TextFormat((Region("tool", "[", at_start=True, keep_open=True),), pythonic),
    "llama4_pythonic": TextFormat((Region("tool", "<|python_start|>", "<|python_end|>"),
                                   Region("tool", "[", at_start=True, keep_open=True)), pythonic,
                                  drop=("<|eom|>", "<|eot|>")),
    "mistral": TextFormat((Region("tool", "[TOOL_CALLS]"),), mistral),
    "deepseek_v3": TextFormat((Region("tool", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),), deepseek,
                              drop=("<｜end▁of▁sentence｜>",)),
    "granite": TextFormat((Region("tool", "<|tool_call|>"), Region("tool", "<tool_call>")), json_objects),
    "gemma4": TextFormat((Region("tool", "<|tool_call>", "<tool_call|>"),), gemma4,
                         drop=("<turn|>", "<eos>")),
    "kimi_k2": TextFormat((Region("tool", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),), kimi_k2,
                          drop=("<|im_end|>",)),
    "glm45": TextFormat((Region("tool", "<tool_call>", "</tool_call>"),), glm45,
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
