"""Tool-call parsers fed whole and char by char, for the parsing tests."""
from __future__ import annotations

import json

from workers.engine.output.parsing.families import REASONING_FORMATS, TOOL_FORMATS
from workers.engine.output.parsing.reading import NAME
from workers.engine.output.parsing.regions import RegionParser

from ..parse_whole import joined


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                           "note": {"type": "string"}}, "required": ["city", "days"]}


SCHEMAS = {"get_weather": WEATHER}


CALL = ("get_weather", {"city": "Paris", "days": 3})


def region_parser(tool: str, reasoning: str | None, parse_tools: bool = True, prime: str = "") -> RegionParser:
    parser = RegionParser(REASONING_FORMATS.get(reasoning or ""), TOOL_FORMATS[tool], parse_tools, SCHEMAS)
    parser.prime(prime)
    return parser


def both_ways(make, text: str) -> tuple[tuple, tuple]:
    """(whole, char by char), each joined: (reasoning, content, [(name, arguments as a dict)])."""
    def decoded(result):
        reasoning, content, calls = result
        return reasoning, content, [(name, json.loads(arguments)) for name, arguments in calls]

    whole = make()
    at_once = whole.feed(text) + whole.finish()
    one_by_one = make()
    streamed = [part for char in text for part in one_by_one.feed(char)] + one_by_one.finish()
    return decoded(joined(at_once)), decoded(joined(streamed))


def assert_well_formed(parts: list[dict]) -> None:
    """Parts a client can follow: calls open in index order (a valid name, a unique id), each argument
    fragment belongs to the call opened last, no empty text."""
    ids = []
    for part in parts:
        assert part["type"] in ("content", "reasoning", "tool_call", "arguments"), part
        if part["type"] == "tool_call":
            assert part["index"] == len(ids) and NAME.fullmatch(part["name"]), part
            ids.append(part["id"])
        else:
            assert part["text"], part
            assert part["type"] != "arguments" or part["index"] == len(ids) - 1, part
    assert len(set(ids)) == len(ids)
