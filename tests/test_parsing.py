"""The worker's output parsers (workers/engine/output/parsing) on hand-written answers of every family: whole and
fed one character at a time (a long call's arguments streaming in fragments), malformed and cut ones too
(nothing raises, a cut call ends as far as it was written); the forced-call grammars accept the very
text their family's parser reads; which parser a model's files choose."""
from __future__ import annotations

import json

import llguidance
import llguidance.hf
import pytest

from protocol.output_formats import ParserChoice, choose_parsers, detect_parsers
from workers.engine.output.parsing.families import REASONING_FORMATS, TOOL_FORMATS
from workers.engine.output.parsing.harmony import HarmonyTextParser, harmony_encoding, write_vocabulary
from workers.engine.output.parsing.regions import RegionParser
from workers.engine.output.parsing.template import TemplateParser
from workers.engine.output.parsing.tool_grammars import banned_markers, tool_call_grammar
from workers.engine.output.parsing.factory import OutputFormat
from workers.tiny.chat_formats import QWEN_RESPONSE_TEMPLATE

from .parse_whole import joined, parse_text
from .helpers.parsing import CALL, WEATHER, assert_well_formed, both_ways, region_parser

# family -> (tool parser, reasoning parser, answer, expected (reasoning, content, [(name, arguments)]))
ANSWERS = {
    "hermes": ("hermes", "qwen3", '<think>\nneed weather\n</think>\n\nSure. <tool_call>\n{"name": "get_weather", '
               '"arguments": {"city": "Paris", "days": 3}}\n</tool_call>', ("need weather", "Sure.", [CALL])),
    "qwen3_coder": ("qwen3_coder", "qwen3", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", ("", "", [CALL])),
    "llama3_json": ("llama3_json", None, '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
                    ("", "", [CALL])),
    "llama3_python_tag": ("llama3_json", None, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", '
                          '"days": 3}}; {"name": "get_weather", "parameters": {"city": "Rome", "days": 1}}',
                          ("", "", [CALL, ("get_weather", {"city": "Rome", "days": 1})])),
    "pythonic": ("pythonic", None, '[get_weather(city="Paris", days=3)]', ("", "", [CALL])),
    "llama4": ("llama4_pythonic", None, '<|python_start|>[get_weather(city="Paris", days=3)]<|python_end|>',
               ("", "", [CALL])),
    "mistral_json": ("mistral", "mistral", '[THINK]plan[/THINK]On it.[TOOL_CALLS][{"name": "get_weather", '
                     '"arguments": {"city": "Paris", "days": 3}}]', ("plan", "On it.", [CALL])),
    "mistral_named": ("mistral", None, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}'
                      '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "days": 1}',
                      ("", "", [CALL, ("get_weather", {"city": "Rome", "days": 1})])),
    "deepseek_v3": ("deepseek_v3", "deepseek_r1", "hmm</think>ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
                    '<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜>'
                    "<｜tool▁calls▁end｜>", ("hmm", "ok", [CALL])),
    "deepseek_v31": ("deepseek_v31", None, '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": '
                     '"Paris", "days": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', ("", "", [CALL])),
    "granite": ("granite", "granite", 'Here is my thought process: look it up Here is my response: <|tool_call|>'
                '[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]', ("look it up", "", [CALL])),
    "gemma4": ("gemma4", "gemma4", '<|channel>thought\nplan<channel|>Hi<|tool_call>call:get_weather{city:<|"|>Paris'
               '<|"|>,days:3}<tool_call|>', ("plan", "Hi", [CALL])),
    "kimi_k2": ("kimi_k2", "qwen3", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|><|tool_calls_section_end|>',
                ("", "", [CALL])),
    "glm45": ("glm45", "glm45", "<think>x</think><tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
              "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", ("x", "", [CALL])),
}


@pytest.mark.parametrize("family", sorted(ANSWERS))
def test_each_family_whole_and_char_by_char(family):
    tool, reasoning, text, expected = ANSWERS[family]
    whole, streamed = both_ways(lambda: region_parser(tool, reasoning), text)
    assert whole == streamed == expected


@pytest.mark.parametrize("family", sorted(ANSWERS))
def test_cut_calls_end_as_far_as_written_and_malformed_ones_never_raise(family):
    """Every prefix of the answer (a cut at any token) parses without raising into parts a client can
    follow; a call cut after its name was read ends as far as it was written (its arguments a prefix of
    the whole answer's); a corrupted call never raises either."""
    tool, reasoning, text, _ = ANSWERS[family]
    whole = region_parser(tool, reasoning)
    full = joined(whole.feed(text) + whole.finish())[2]
    for end in range(0, len(text)):
        parser = region_parser(tool, reasoning)
        parts = parser.feed(text[:end]) + parser.finish()
        assert_well_formed(parts)
        calls = joined(parts)[2]
        assert len(calls) <= len(full)
        for (name, arguments), (full_name, full_arguments) in zip(calls, full):
            # (a region that runs to the answer's end and stops right after a name has no arguments: `{}`)
            assert name == full_name and (full_arguments.startswith(arguments) or arguments == "{}"), (text[:end], calls)
    corrupted = text.replace('"Paris"', '"Paris').replace("Paris", "Par{is(")
    parser = region_parser(tool, reasoning)
    assert_well_formed(parser.feed(corrupted) + parser.finish())


def test_after_a_call_text_that_is_no_call_is_content():
    parser = region_parser("hermes", None)
    parts = parser.feed('<tool_call>\n{"name": "f", "arguments": {"a": 1} oops}\n</tool_call>Done.') + parser.finish()
    assert joined(parts) == ("", "oops}\n</tool_call>Done.", [("f", '{"a": 1}')])  # the rest, as written
    parser = region_parser("hermes", None)
    parts = parser.feed('<tool_call>\n{"name": "f", "arguments": {"a": 1}} oops\n</tool_call>Done.') + parser.finish()
    assert joined(parts) == ("", " oops\n</tool_call>Done.", [("f", '{"a": 1}')])
    parser = region_parser("hermes", None)
    parts = parser.feed('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call> Done.') + parser.finish()
    assert joined(parts) == ("", "Done.", [("f", '{"a": 1}')])


def test_a_cut_hermes_call_is_content_verbatim_until_its_name_is_read_and_tags_are_held_back():
    assert parse_text('<tool_call>\n{"name": "f', parse_tools=True) == ("", '<tool_call>\n{"name": "f', [])
    assert parse_text('<tool_call>\n{"name": "f", "argu', parse_tools=True) == ("", "", [("f", "")])
    assert parse_text('<tool_call>\n{"name": "f", "arguments": {"a": "b', parse_tools=True)[2] == [("f", '{"a": "b')]
    assert parse_text("<tool_call>not json</tool_call> tail", parse_tools=True)[1] == "<tool_call>not json</tool_call> tail"
    parser = region_parser("hermes", "qwen3")
    assert [p["text"] for p in parser.feed("Hi <tool")] == ["Hi"]
    assert joined(parser.feed("box>") + parser.finish())[1] == " <toolbox>"


def test_tools_not_parsed_leave_the_call_as_text():
    text = ANSWERS["hermes"][2]
    assert parse_text(text, parse_tools=False)[1].endswith("</tool_call>")


def test_priming_continues_a_prefilled_block():
    parser = region_parser("hermes", "qwen3", prime='<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {}}\n')
    assert joined(parser.feed("</tool_call>") + parser.finish())[2] == [("f", "{}")]
    thinking = region_parser("hermes", "qwen3", prime="<|im_start|>assistant\n<think>\nSo far")
    assert joined(thinking.feed(", more.</think>Answer") + thinking.finish())[:2] == (", more.", "Answer")
    closed = region_parser("deepseek_v3", "deepseek_r1", prime="<think>\n\n</think>")
    assert joined(closed.feed("Answer") + closed.finish())[:2] == ("", "Answer")


def test_parallel_tool_calls_false_keeps_the_first_call():
    from workers.engine.output.parsing.parts import Calls

    parser = RegionParser(None, TOOL_FORMATS["mistral"], True, {}, Calls(limit=1))
    assert len(joined(parser.feed(ANSWERS["mistral_named"][2]) + parser.finish())[2]) == 1


def test_call_ids_are_unique_and_openai_shaped():
    parser = region_parser("llama3_json", None)
    parts = parser.feed(ANSWERS["llama3_python_tag"][2]) + parser.finish()
    ids = [p["id"] for p in parts if p["type"] == "tool_call"]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    assert [p["index"] for p in parts if p["type"] == "tool_call"] == [0, 1]


HARMONY = ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary '
           'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 3}')


def test_harmony_channels_whole_and_char_by_char():
    whole, streamed = both_ways(lambda: HarmonyTextParser(True), HARMONY)
    assert whole == streamed == ("Need the weather.", "", [CALL])
    final = "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny."
    assert both_ways(lambda: HarmonyTextParser(True), final)[0] == ("Hmm.", "It is sunny.", [])
    assert both_ways(lambda: HarmonyTextParser(True), "plain words")[0] == ("", "plain words", [])
    cut = HarmonyTextParser(True)
    assert joined(cut.feed(HARMONY[:60]) + cut.finish())[0] == "Need the weather."


def test_harmony_arguments_stream_as_they_come():
    parser = HarmonyTextParser(True)
    first = parser.feed(HARMONY[:HARMONY.index("{") + 8])
    assert [p["type"] for p in first] == ["reasoning", "tool_call", "arguments"] and first[1]["name"] == "get_weather"


def test_openai_harmony_is_not_tried_for_another_vocabulary(tmp_path):
    """A tokenizer whose Harmony markers are not o200k's ids never reaches the library (no download); the
    vocabulary file written from a byte-level tokenizer has its format (base64 bytes, rank)."""
    from workers.tiny.builders import train_tokenizer

    tokenizer = train_tokenizer(300)
    assert harmony_encoding(tokenizer) is None
    line = (write_vocabulary(tokenizer, tmp_path) / "o200k_base.tiktoken").read_text().splitlines()[0]
    token, rank = line.split(" ")
    assert int(rank) >= 0 and token


TEMPLATE = QWEN_RESPONSE_TEMPLATE  # as Qwen's, in the tiny response_template model's tokenizer config


def test_a_response_template_is_read_by_transformers_parser():
    text = ('<think>plan</think>Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
            "</tool_call>")

    def make():
        return TemplateParser(TEMPLATE, "<|im_start|>assistant\n", [{"type": "function", "function": {
            "name": "get_weather", "parameters": WEATHER}}], True)

    whole, streamed = both_ways(make, text)
    assert whole == streamed == ("plan", "Sure.", [CALL])
    broken = make()
    result = joined(broken.feed('<tool_call>{"name": oops</tool_call> after') + broken.finish())
    assert result[2] == [] and "oops" in result[1] and "after" in result[1]


@pytest.fixture(scope="module")
def ll_tokenizer():
    from workers.tiny.builders import train_tokenizer

    tokenizer = train_tokenizer()
    return tokenizer, llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))


GRAMMAR_TEXTS = {  # syntax -> a call as the grammar writes it (compact JSON, required parameters)
    "hermes": '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","days":3}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
                   "</parameter>\n</function>\n</tool_call>",
    "llama3_json": '{"name":"get_weather","parameters":{"city":"Paris","days":3}}',
    "pythonic": '[get_weather(city="Paris", days=3)]',
    "mistral": '[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"Paris","days":3}}]',
    "mistral_named": '[TOOL_CALLS]get_weather[ARGS]{"city":"Paris","days":3}',
    "deepseek_v3": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city":"Paris",'
                   '"days":3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek_v31": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city":"Paris","days":3}'
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "granite": '<|tool_call|>[{"name":"get_weather","arguments":{"city":"Paris","days":3}}]',
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>',
    "kimi_k2": '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
               '{"city":"Paris","days":3}<|tool_call_end|><|tool_calls_section_end|>',
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
             "<arg_value>3</arg_value>\n</tool_call>",
}


@pytest.mark.parametrize("syntax", sorted(GRAMMAR_TEXTS))
def test_the_forced_call_grammar_writes_what_the_parser_reads(syntax, ll_tokenizer):
    tokenizer, ll = ll_tokenizer
    text = GRAMMAR_TEXTS[syntax]
    grammar = tool_call_grammar({"syntax": syntax, "tools": [{"name": "get_weather", "parameters": WEATHER}]}, tokenizer)
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    assert matcher.consume_tokens(tokenizer(text, add_special_tokens=False)["input_ids"]), matcher.get_error()
    assert matcher.is_accepting()
    parser = region_parser("mistral" if syntax == "mistral_named" else syntax, None)
    assert [(name, json.loads(arguments)) for name, arguments in joined(parser.feed(text) + parser.finish())[2]] == [CALL]


@pytest.mark.parametrize("syntax,text", [
    ("hermes", GRAMMAR_TEXTS["hermes"] + "\n" + GRAMMAR_TEXTS["hermes"].replace("Paris", "Rome")),
    ("kimi_k2", GRAMMAR_TEXTS["kimi_k2"].replace("<|tool_calls_section_end|>", "") + "<|tool_call_begin|>functions."
     'get_weather:1<|tool_call_argument_begin|>{"city":"Rome","days":1}<|tool_call_end|><|tool_calls_section_end|>'),
])
def test_required_with_parallel_calls_allows_several_in_the_familys_wrapper(syntax, text, ll_tokenizer):
    tokenizer, ll = ll_tokenizer
    spec = {"syntax": syntax, "many": True, "tools": [{"name": "get_weather", "parameters": WEATHER}]}
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(tool_call_grammar(spec, tokenizer)))
    assert matcher.consume_tokens(tokenizer(text, add_special_tokens=False)["input_ids"]) and matcher.is_accepting()
    parser = region_parser(syntax, None)
    assert len(joined(parser.feed(text) + parser.finish())[2]) == 2


def test_harmony_grammar_and_tool_choice_none_markers(ll_tokenizer):
    tokenizer, ll = ll_tokenizer
    grammar = tool_call_grammar({"syntax": "openai", "many": True,
                                 "tools": [{"name": "get_weather", "parameters": WEATHER}]}, tokenizer)
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    text = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris","days":3}<|call|>'
    assert matcher.consume_tokens(tokenizer(text, add_special_tokens=False)["input_ids"]) and matcher.is_accepting()
    fmt = lambda tool: OutputFormat(ParserChoice(tool, None, "default"), ParserChoice(tool, None, "default"))  # noqa: E731
    assert banned_markers(fmt("hermes")) == ["<tool_call>"]
    assert banned_markers(fmt("mistral")) == ["[TOOL_CALLS]"]
    assert banned_markers(fmt("llama3_json")) == ["<|python_tag|>"]  # a bare "{" opens no call to ban


@pytest.mark.parametrize("model_type,template,tokens,expected", [
    ("qwen2", "{{ '<tool_call>' }}<think>", [], ("hermes", "qwen3", "chat_template")),
    ("qwen3_5", "", [], ("qwen3_coder", "qwen3", "model_type")),
    ("llama", "<|python_tag|>", ["<|python_tag|>"], ("llama3_json", None, "chat_template")),
    ("llama4", "", [], ("llama4_pythonic", None, "model_type")),
    ("mistral", "", ["[TOOL_CALLS]", "[THINK]"], ("mistral", "mistral", "chat_template")),
    ("mistral", "", [], ("mistral", None, "model_type")),
    ("deepseek_v3", "'<｜tool▁calls▁begin｜>' + '```json'", ["<｜tool▁calls▁begin｜>"], ("deepseek_v3", "deepseek_r1", "chat_template")),
    ("deepseek_v3", "'<｜tool▁calls▁begin｜>' + name + '<｜tool▁sep｜>'", [], ("deepseek_v31", "deepseek_r1", "chat_template")),
    ("deepseek_v3", "<|tool_calls_section_begin|>", [], ("kimi_k2", "qwen3", "chat_template")),  # Kimi K2 on V3's architecture
    ("deepseek_v3", "", [], ("deepseek_v31", "deepseek_r1", "model_type")),
    ("granite", "<|tool_call|>", [], ("granite", "granite", "chat_template")),
    ("gemma4", "", [], ("gemma4", "gemma4", "model_type")),
    ("kimi_k2", "", [], ("kimi_k2", "qwen3", "model_type")),
    ("glm4_moe", "", [], ("glm45", "glm45", "model_type")),
    ("gpt_oss", "", [], ("openai", "openai_gptoss", "model_type")),
    ("gpt2", "", [], ("hermes", "qwen3", "default")),
])
def test_the_family_is_found_from_model_type_template_and_tokens(model_type, template, tokens, expected):
    choice = detect_parsers(model_type, template, tokens)
    assert (choice.tool_parser, choice.reasoning_parser, choice.source) == expected


def test_a_response_template_wins_and_overrides_win_over_all():
    assert detect_parsers("qwen2", "<tool_call>", [], has_response_template=True).tool_parser == "response_template"
    detected = detect_parsers("qwen2", "<tool_call>", [])
    chosen = choose_parsers(detected, "qwen3_xml", "none")
    assert (chosen.tool_parser, chosen.reasoning_parser, chosen.source) == ("qwen3_coder", None, "override")
    with pytest.raises(ValueError):
        choose_parsers(detected, "no_such_parser")


def test_a_familys_markers_are_kept_and_its_other_special_tokens_hidden(ll_tokenizer):
    from workers.engine.output.parsing import output_format
    from workers.tiny.chat_formats import format_tokenizer

    tokenizer = format_tokenizer("llama3_json", ll_tokenizer[0])
    fmt = output_format(tokenizer, "llama")
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ("<|python_tag|>", "<|begin_of_text|>", "<|eot_id|>")}
    assert fmt.tool_parser == "llama3_json" and fmt.keep_special_tokens
    assert ids["<|python_tag|>"] not in fmt.hidden_ids
    assert {ids["<|begin_of_text|>"], ids["<|eot_id|>"]} <= fmt.hidden_ids
    overridden = output_format(tokenizer, "llama", "hermes", "none")  # the catalog's override: no special marker
    assert (overridden.tool_parser, overridden.choice.reasoning_parser, overridden.keep_special_tokens) == \
        ("hermes", None, False)


def test_random_marker_soup_never_raises():
    """Answers made of every family's markers and JSON-ish debris, fed in random pieces: each parser returns
    well-formed parts (a call's arguments are a JSON object, or the text stayed content), never raises."""
    import random

    from workers.engine.output.parsing.factory import INNER_MARKERS

    rng = random.Random(7)
    pieces = ['{"name": "f", "arguments": {', "}", "[", "]", '"', "(", ")", "x=1", ", ", "\n", "Paris", "call:f{",
              *{m for fmt in TOOL_FORMATS.values() for r in fmt.regions for m in (r.open, r.close) if m},
              *{m for fmt in REASONING_FORMATS.values() for r in fmt.regions for m in (r.open, r.close) if m},
              *{m for markers in INNER_MARKERS.values() for m in markers}]
    makers = [lambda t=t, r=r: region_parser(t, r) for t, r, _, _ in ANSWERS.values()]
    makers += [lambda: HarmonyTextParser(True), lambda: TemplateParser(TEMPLATE, "", None, True)]
    for _ in range(60):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        for make in makers:
            parser, out, position = make(), [], 0
            while position < len(text):
                step = rng.randint(1, 6)
                out += parser.feed(text[position:position + step])
                position += step
            out += parser.finish()
            assert_well_formed(out)
