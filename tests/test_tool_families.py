"""Tool calls and reasoning of every model family, end to end through one real server.

Each family's tiny model (workers/tiny/chat_formats.py: a tiny model of the family's architecture with its
marker tokens and a chat template written from its documented format) is made to write a given answer through the
server's own structured-output path (a grammar that forces that exact text, markers as their tokens);
then: the non-streamed message, the streamed deltas reassembled to the same, Responses' function_call
item, tool_choice naming a function (the server's grammar in the family's syntax), and the call and its
result rendered back into the next prompt by the family's template.
"""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from workers.engine.output.parsing.tool_grammars import LarkText
from workers.tiny.builders import train_tokenizer
from workers.tiny.chat_formats import FORMATS, build_chat_format_model
from workers.tiny.families import build_tiny_family

from .live_server import LiveServer, base_env

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
              "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": PARAMETERS}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
CALL = ("get_weather", {"city": "Paris"})

# family -> (the answer forced, its expected reasoning and content, template kwargs)
ANSWERS = {
    "hermes": ('<think>\nplan\n</think>\n\nSure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
               "</tool_call>", ("plan", "Sure."), {}),
    "qwen3_coder": ("<think>\nplan\n</think>\n\nSure.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                    "</parameter>\n</function>\n</tool_call>", ("plan", "Sure."), {}),
    "llama3_json": ('{"name": "get_weather", "parameters": {"city": "Paris"}}', ("", ""), {}),
    "llama4_pythonic": ('<|python_start|>[get_weather(city="Paris")]<|python_end|>', ("", ""), {}),
    "mistral": ('[THINK]plan[/THINK]Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', ("plan", "Sure."), {}),
    "deepseek_v31": ("plan</think>Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                     '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', ("plan", "Sure."), {"thinking": True}),
    "granite": ('Here is my thought process: plan Here is my response: Sure.<|tool_call|>[{"name": "get_weather", '
                '"arguments": {"city": "Paris"}}]', ("plan", "Sure."), {}),
    "gemma4": ('<|channel>thought\nplan<channel|>Sure.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
               ("plan", "Sure."), {}),
    "kimi_k2": ("<think>plan</think>Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
                ("plan", "Sure."), {}),
    "glm45": ("<think>plan</think>\nSure.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
              "</tool_call>", ("plan", "Sure."), {}),
    "response_template": ('<think>\nplan\n</think>\n\nSure.<tool_call>\n{"name": "get_weather", "arguments": '
                          '{"city": "Paris"}}\n</tool_call>', ("plan", "Sure."), {}),
    "openai": ("<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>commentary<|message|>Sure.<|end|>"
               "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
               '{"city": "Paris"}<|call|>', ("plan", "Sure."), {}),
}


OVERRIDDEN = "local/tiny-overridden"
RETEMPLATED = "local/tiny-retemplated"  # the tiny Hermes model given Qwen3-Coder's template by the config file


def model_of(family: str) -> str:
    return f"local/tiny-{family}"


@pytest.fixture(scope="module")
def family_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("family-cache")
    base = train_tokenizer()
    build_tiny_family("qwen3", model_of("hermes"), cache, tokenizer=base)  # the tiny models' own Hermes template
    for family in FORMATS:
        build_chat_format_model(model_of(family), family, cache, base)
    build_chat_format_model(OVERRIDDEN, "llama3_json", cache, base)  # Llama 3's format, parsed as the config says
    build_tiny_family("qwen3", RETEMPLATED, cache, tokenizer=base)
    return cache


@pytest.fixture(scope="module")
def family_server(family_cache, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("family-server")
    config = work_dir / "server.yaml"
    template = work_dir / "qwen3_coder.jinja"
    template.write_text(FORMATS["qwen3_coder"].template)
    config.write_text(json.dumps({"models": [{"name": OVERRIDDEN, "tool-parser": "hermes", "reasoning-parser": "none"},
                                             {"name": RETEMPLATED, "chat-template": str(template)}]}))
    live = LiveServer(base_env(family_cache, work_dir), work_dir, ("--config", str(config)), name="families")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def sdk(family_server) -> OpenAI:
    return OpenAI(base_url=f"{family_server.base_url}/v1", api_key=family_server.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizers(family_cache) -> dict:
    return {family: AutoTokenizer.from_pretrained(model_of(family), cache_dir=family_cache, local_files_only=True)
            for family in ANSWERS}


def forced(answer: str, tokenizer) -> dict:
    """The request's extra body that makes the model write exactly `answer` (its markers as their tokens)."""
    return {"structured_outputs": {"grammar": "start: " + LarkText(tokenizer).text(answer)}}


def reassembled(chunks) -> tuple[str, str, list[dict]]:
    """Streamed chat chunks joined: (reasoning, content, calls as OpenAI's message lists them)."""
    reasoning = content = ""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += delta.model_extra.get("reasoning_content") or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.id:  # the first delta of a call: index, id and name, no arguments yet
                assert call.function.name and not call.function.arguments
                calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
            else:
                calls[call.index]["arguments"] += call.function.arguments
    return reasoning, content, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("family", sorted(ANSWERS))
def test_family_tool_call_and_reasoning_end_to_end(family, sdk, family_server, tokenizers):
    answer, (reasoning, content), kwargs = ANSWERS[family]
    tokenizer = tokenizers[family]
    models = {m.id: m.model_extra.get("parsers") for m in sdk.models.list().data}
    assert models[model_of(family)]["tool_parser"] == family  # found from the template and tokens alone
    body = dict(model=model_of(family), messages=USER, tools=[WEATHER], temperature=0, max_tokens=120,
                extra_body={**forced(answer, tokenizer), "chat_template_kwargs": kwargs})

    whole = sdk.chat.completions.create(**body).choices[0]
    message = whole.message
    assert whole.finish_reason == "tool_calls", message
    assert (message.model_extra.get("reasoning_content") or "", message.content or "") == (reasoning, content)
    [call] = message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == CALL and call.id.startswith("call_")

    streamed = reassembled(sdk.chat.completions.create(**body, stream=True))
    assert streamed[:2] == (reasoning, content)
    assert [(c["name"], c["arguments"]) for c in streamed[2]] == [(call.function.name, call.function.arguments)]

    named = sdk.chat.completions.create(model=model_of(family), messages=USER, tools=[WEATHER], temperature=0.8,
                                        seed=1, max_tokens=80, extra_body={"chat_template_kwargs": kwargs},
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.choices[0].message.tool_calls, named.choices[0]
    [named_call] = named.choices[0].message.tool_calls
    assert named_call.function.name == "get_weather"
    jsonschema.validate(json.loads(named_call.function.arguments), PARAMETERS)

    follow_up = [*USER, {"role": "assistant", "content": message.content, "reasoning_content": reasoning or None,
                         "tool_calls": [call.model_dump(include={"id", "type", "function"})]},
                 {"role": "tool", "tool_call_id": call.id, "content": "22 C"}]
    tokens = httpx.post(f"{family_server.base_url}/tokenize", headers=family_server.headers, timeout=60,
                        json={"model": model_of(family), "messages": follow_up, "tools": [WEATHER]}).json()["tokens"]
    as_template = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(
        c["function"]["arguments"])}} for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in follow_up]
    as_template[1] = {k: v for k, v in as_template[1].items() if v is not None}
    expected = tokenizer.apply_chat_template(as_template, tools=[WEATHER], add_generation_prompt=True, tokenize=True,
                                             return_dict=False)
    assert tokens == expected
    rendered = tokenizer.decode(tokens)
    assert "22 C" in rendered and "Paris" in rendered


@pytest.mark.parametrize("family", ["hermes", "mistral", "openai", "response_template"])
def test_family_responses_function_call_items(family, sdk):
    """Responses: a forced call is a function_call item; its streamed argument deltas join to its arguments."""
    tool = {"type": "function", "name": "get_weather", "parameters": PARAMETERS}
    body = dict(model=model_of(family), input="Weather in Paris?", tools=[tool], temperature=0.8,
                max_output_tokens=80, tool_choice={"type": "function", "name": "get_weather"})
    response = sdk.responses.create(**body)
    [item] = [i for i in response.output if i.type == "function_call"]
    assert item.name == "get_weather" and item.call_id.startswith("call_")
    jsonschema.validate(json.loads(item.arguments), PARAMETERS)
    events = list(sdk.responses.create(**body, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments and done.name == "get_weather"
    jsonschema.validate(json.loads(done.arguments), PARAMETERS)


LONG_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                   "note": {"type": "string", "minLength": 40, "maxLength": 60}},
                   "required": ["city", "note"], "additionalProperties": False}


@pytest.mark.parametrize("family", ["hermes", "qwen3_coder", "mistral", "gemma4", "llama4_pythonic", "kimi_k2"])
def test_a_long_calls_arguments_stream_in_fragments_that_join_to_the_whole_answer(family, sdk):
    """A call with a long argument (tool_choice naming it, greedy): chat's `tool_calls[].function.arguments`
    deltas and Responses' `response.function_call_arguments.delta` events come in many fragments after the
    call's name, and join to exactly the non-streamed answer's arguments."""
    def fragments_of(chunks) -> list[str]:
        return [call.function.arguments for chunk in chunks if chunk.choices
                for call in chunk.choices[0].delta.tool_calls or [] if not call.id]

    body = dict(model=model_of(family), messages=USER, temperature=0, max_tokens=200,
                tools=[{"type": "function", "function": {"name": "get_weather", "parameters": LONG_PARAMETERS}}],
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    [call] = sdk.chat.completions.create(**body).choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), LONG_PARAMETERS)
    chunks = list(sdk.chat.completions.create(**body, stream=True))
    assert reassembled(chunks)[2] == [{"id": reassembled(chunks)[2][0]["id"], "name": "get_weather",
                                       "arguments": call.function.arguments}]
    assert len(fragments_of(chunks)) > 4

    tool = {"type": "function", "name": "get_weather", "parameters": LONG_PARAMETERS}
    request = dict(model=model_of(family), input="Weather in Paris?", tools=[tool], temperature=0,
                   max_output_tokens=200, tool_choice={"type": "function", "name": "get_weather"})
    [item] = [i for i in sdk.responses.create(**request).output if i.type == "function_call"]
    events = list(sdk.responses.create(**request, stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [added] = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert added.item.name == "get_weather" and events.index(added) < events.index(
        next(e for e in events if e.type == "response.function_call_arguments.delta"))
    assert len(deltas) > 4 and "".join(deltas) == item.arguments
    jsonschema.validate(json.loads(item.arguments), LONG_PARAMETERS)


def test_the_config_files_parsers_win_over_what_the_files_say(sdk, family_cache):
    """A Llama 3 model told `tool_parser: hermes`, `reasoning_parser: none` in `serve --config`: the catalog
    shows the override, and its answer is read that way (a Hermes call parsed, `<think>` left as text)."""
    models = {m.id: m.model_extra.get("parsers") for m in sdk.models.list().data}
    assert models[OVERRIDDEN] == {"tool_parser": "hermes", "reasoning_parser": None, "source": "override"}
    tokenizer = AutoTokenizer.from_pretrained(OVERRIDDEN, cache_dir=family_cache, local_files_only=True)
    answer = '<think>x</think><tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    message = sdk.chat.completions.create(model=OVERRIDDEN, messages=USER, tools=[WEATHER], max_tokens=80,
                                          extra_body=forced(answer, tokenizer)).choices[0].message
    assert message.content == "<think>x</think>" and message.model_extra.get("reasoning_content") is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [CALL]


def test_a_chat_template_set_for_a_model_chooses_its_parsers_in_the_catalog_as_on_the_worker(sdk, family_cache):
    """The config file gives the tiny Hermes model Qwen3-Coder's template: the catalog reads the parsers from
    that template (not the model's own files), as the worker does, and its answer is read that way."""
    models = {m.id: m.model_extra.get("parsers") for m in sdk.models.list().data}
    assert models[RETEMPLATED] == {"tool_parser": "qwen3_coder", "reasoning_parser": "qwen3", "source": "chat_template"}
    assert models[model_of("hermes")]["tool_parser"] == "hermes"  # the same files without the template
    tokenizer = AutoTokenizer.from_pretrained(RETEMPLATED, cache_dir=family_cache, local_files_only=True)
    answer = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    message = sdk.chat.completions.create(model=RETEMPLATED, messages=USER, tools=[WEATHER], max_tokens=80,
                                          extra_body=forced(answer, tokenizer)).choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [CALL]


def test_parallel_tool_calls_false_keeps_the_first_call(sdk, tokenizers):
    answer = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'
    body = dict(model=model_of("mistral"), messages=USER, tools=[WEATHER], max_tokens=80,
                extra_body=forced(answer, tokenizers["mistral"]))
    both = sdk.chat.completions.create(**body).choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in both] == ["Paris", "Rome"]
    [first] = sdk.chat.completions.create(**body, parallel_tool_calls=False).choices[0].message.tool_calls
    assert json.loads(first.function.arguments) == {"city": "Paris"}
