"""The output parser on known texts: whole, and fed in every split (one character at a time)."""
from __future__ import annotations

import json

import pytest

from openai_api.output_parsing import OutputParser

from .parse_whole import parse_text

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def feed_in_chars(text: str, reasoning_open: bool = False, parse_tools: bool = False):
    parser = OutputParser(reasoning_open, parse_tools)
    pieces = [piece for ch in text for piece in parser.feed(ch)] + parser.finish()
    return pieces, parser.tool_calls


def joined(pieces, kind: str) -> str:
    return "".join(p.text for p in pieces if p.kind == kind)


CASES = [
    # text, reasoning_open, parse_tools, expected (reasoning, content, [(name, args)])
    ("Just text.", False, False, ("", "Just text.", [])),
    ("<think>\nPlan it.\n</think>\n\nThe answer.", False, False, ("Plan it.", "The answer.", [])),
    ("Plan it.\n</think>\n\nThe answer.", True, False, ("Plan it.", "The answer.", [])),
    ("still thinking", True, False, ("still thinking", "", [])),
    ("a < b and <thin ice>", False, False, ("", "a < b and <thin ice>", [])),
    (CALL, False, True, ("", "", [("get_weather", {"city": "Paris"})])),
    ("Sure. " + CALL + "\n" + CALL.replace("Paris", "Rome"), False, True,
     ("", "Sure.", [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})])),
    ("<think>\nneed weather\n</think>\n\n" + CALL, False, True, ("need weather", "", [("get_weather", {"city": "Paris"})])),
    (CALL, False, False, ("", CALL, [])),  # tools not parsed: the text stays
    ("<tool_call>not json</tool_call> tail", False, True, ("", "<tool_call>not json</tool_call> tail", [])),
    ('<tool_call>\n{"name": "f", "arguments": {}}', False, True, ("", "", [("f", {})])),  # unterminated but whole
]


@pytest.mark.parametrize("text,reasoning_open,parse_tools,expected", CASES)
def test_whole_and_char_by_char_agree_with_the_expected_split(text, reasoning_open, parse_tools, expected):
    reasoning, content, calls = parse_text(text, reasoning_open, parse_tools)
    assert (reasoning, content, [(c.name, json.loads(c.arguments)) for c in calls]) == expected
    pieces, streamed_calls = feed_in_chars(text, reasoning_open, parse_tools)
    assert joined(pieces, "reasoning") == expected[0]
    assert joined(pieces, "content") == expected[1]
    assert [(c.name, json.loads(c.arguments)) for c in streamed_calls] == expected[2]


def test_reasoning_comes_before_content_and_tags_never_leak():
    pieces, _ = feed_in_chars("<think>\nstep one\n</think>\n\nDone.")
    kinds = [p.kind for p in pieces]
    assert kinds == sorted(kinds, key=lambda k: k != "reasoning")
    assert all("<" not in p.text for p in pieces)


def test_tool_calls_get_unique_openai_ids_and_indexes():
    _, _, calls = parse_text(CALL + CALL, parse_tools=True)
    assert [c.index for c in calls] == [0, 1]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert calls[0].as_dict()["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_a_partial_tag_is_held_back_until_settled():
    parser = OutputParser(parse_tools=True)
    assert [p.text for p in parser.feed("Hi <tool")] == ["Hi"]
    assert joined(parser.feed("box>"), "content") == " <toolbox>"  # not a tag after all
    assert parser.finish() == []


def test_priming_with_a_prefill_continues_its_open_tag():
    parser = OutputParser(parse_tools=True)
    parser.prime('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n')
    pieces = parser.feed("</tool_call>") + parser.finish()
    assert [p.kind for p in pieces] == ["tool_call"] and pieces[0].tool_call.name == "f"
    thinking = OutputParser()
    thinking.prime("<think>\nSo far")
    assert joined(thinking.feed(", more.</think>Answer") + thinking.finish(), "reasoning") == ", more."
