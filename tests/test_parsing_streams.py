"""Tool calls streamed by the worker's parsers (workers/engine/output/parsing/reading.py): fed one character at a
time, a call opens as soon as its name is read and its arguments follow in many fragments, joined to exactly
what the whole text gives, for every format; unusual but valid shapes read alike both ways."""
from __future__ import annotations

import json

import pytest

from workers.engine.output.parsing.families import TOOL_FORMATS
from workers.engine.output.parsing.harmony import HarmonyTextParser
from workers.engine.output.parsing.regions import RegionParser

from .parse_whole import joined
from .helpers.parsing import assert_well_formed, both_ways, region_parser

NOTE = ('Bring a coat: the forecast says "rain" at 5\\6 \u2014 ünïcode, and wind.\n' * 6).strip()
LONG_CALL = ("get_weather", {"city": "Paris", "note": NOTE})
LONG_JSON = json.dumps(LONG_CALL[1], ensure_ascii=False)
# family -> (make a parser, a long call in its format)
LONG_ANSWERS = {
    "hermes": (("hermes", "qwen3"), '<tool_call>\n{"name": "get_weather", "arguments": ' + LONG_JSON + "}\n</tool_call>"),
    "llama3_json": (("llama3_json", None), '{"name": "get_weather", "parameters": ' + LONG_JSON + "}"),
    "mistral_json": (("mistral", None), '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + LONG_JSON + "}]"),
    "mistral_named": (("mistral", None), "[TOOL_CALLS]get_weather[ARGS]" + LONG_JSON),
    "deepseek_v3": (("deepseek_v3", None), "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                    "```json\n" + LONG_JSON + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "deepseek_v31": (("deepseek_v31", None), "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                     + LONG_JSON + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "granite": (("granite", None), '<|tool_call|>[{"name": "get_weather", "arguments": ' + LONG_JSON + "}]"),
    "kimi_k2": (("kimi_k2", None), "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                "<|tool_call_argument_begin|>" + LONG_JSON + "<|tool_call_end|><|tool_calls_section_end|>"),
    "qwen3_coder": (("qwen3_coder", None), "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                    "<parameter=note>\n" + NOTE + "\n</parameter>\n</function>\n</tool_call>"),
    "glm45": (("glm45", None), "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
              "<arg_key>note</arg_key>\n<arg_value>" + NOTE + "</arg_value>\n</tool_call>"),
    "pythonic": (("pythonic", None), "[get_weather(city='Paris', note=" + json.dumps(NOTE, ensure_ascii=False) + ")]"),
    "llama4_pythonic": (("llama4_pythonic", None), '<|python_start|>[get_weather(city="Paris", note='
                        + json.dumps(NOTE, ensure_ascii=False) + ")]<|python_end|>"),
    "gemma4": (("gemma4", None), '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,note:<|"|>' + NOTE + '<|"|>}<tool_call|>'),
    "openai": (None, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + LONG_JSON),
}


@pytest.mark.parametrize("family", sorted(LONG_ANSWERS))
def test_a_long_calls_arguments_stream_as_they_are_generated(family):
    """Fed one character at a time: the call opens (index, id, name) as soon as its name is read, its
    arguments follow in many fragments while they are written, and they join to exactly what the whole
    text gives at once."""
    names, text = LONG_ANSWERS[family]

    def make():
        return HarmonyTextParser(True) if names is None else region_parser(*names)

    parser = make()
    steps = [parser.feed(char) for char in text] + [parser.finish()]
    streamed = [part for step in steps for part in step]
    whole = make()
    assert joined(streamed) == joined(whole.feed(text) + whole.finish())
    assert_well_formed(streamed)
    [(name, arguments)] = joined(streamed)[2]
    assert (name, json.loads(arguments)) == LONG_CALL
    opened = next(i for i, step in enumerate(steps) if any(p["type"] == "tool_call" for p in step))
    assert opened < text.index("get_weather") + len("get_weather") + 32  # the name goes out as soon as it is read
    fragments = [i for i, step in enumerate(steps) if any(p["type"] == "arguments" for p in step)]
    assert len(fragments) > len(NOTE) // 2 and fragments[0] >= opened  # the arguments as they are written
    note_end = text.rindex("and wind.")  # before the note was written through
    assert sum(i < note_end for i in fragments) > len(NOTE) // 2


@pytest.mark.parametrize("tool,text,expected", [
    ("hermes", '<tool_call>{"arguments": {"a": [1, "}"]}, "name": "f"}</tool_call>', {"a": [1, "}"]}),  # name last
    ("hermes", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', {"a": 1}),  # a JSON string
    ("hermes", '<tool_call>{"name": "f"}</tool_call>', {}),
    ("pythonic", "[f(s='it\\'s \\u00e9 \\N{EM DASH} \\x41\\\\', n=[1, {'k': (2)}], b=true)]",
     {"s": "it's é — A\\", "n": [1, {"k": 2}], "b": True}),
    ("gemma4", '<|tool_call>call:f{o:{k:<|"|>a,b<|"|>},n:-1.5,s:<|"|>x<|"|>}<tool_call|>', {"o": {"k": "a,b"}, "n": -1.5, "s": "x"}),
    ("qwen3_coder", "<tool_call><function=f><parameter=n>\n[1, 2]\n</parameter><parameter=s>two\nlines\n"
     "</function></tool_call>", {"n": [1, 2], "s": "two\nlines"}),
])
def test_unusual_but_valid_calls_read_alike_whole_and_char_by_char(tool, text, expected):
    whole, streamed = both_ways(lambda: RegionParser(None, TOOL_FORMATS[tool], True, {"f": {"properties": {
        "s": {"type": "string"}}}}), text)
    assert whole == streamed == ("", "", [("f", expected)])
