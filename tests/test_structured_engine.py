"""Constrained decoding, Hugging Face's extra parameters and beam search in the engine alone (no Django).

The tiny model has random weights: whatever it prefers, a grammar must still hold its output
to the schema, and the unconstrained requests batched beside it must not change by a token.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import jsonschema
import pytest
import torch

import protocol
from workers.engine.config import EngineConfig
from workers.engine.core.engine import Engine

from .conftest import TINY_MODEL, engine_running
from .outbox import Outbox
from .helpers.engine import finished
from .helpers.schemas import PERSON

@contextmanager
def running_engine(hf_cache, config: EngineConfig) -> Iterator[tuple[Engine, Outbox]]:
    outbox = Outbox()
    with engine_running(hf_cache, outbox.emit, config) as engine:
        yield engine, outbox


@pytest.fixture(scope="module")
def engine(hf_cache):
    with running_engine(hf_cache, EngineConfig(max_num_seqs=16, grammar_timeout=30)) as running:
        yield running


def submit(engine: Engine, prompt: str | list[int], **params) -> str:
    reply = f"reply.{uuid.uuid4().hex}"
    engine.submit(protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", reply, protocol.ModelRef.parse(TINY_MODEL), [prompt],
                                        protocol.JobParams(**{"max_tokens": 16, **params})))
    return reply


def outputs(outbox: Outbox, reply: str) -> dict[int, dict]:
    """index -> {"text", "token_ids", "finish_reason"} of a finished request (or its error message)."""
    messages = outbox.wait_for(reply, finished, timeout=120)
    if messages[-1]["type"] == protocol.ERROR:
        return {"error": messages[-1]}
    choices: dict[int, dict] = {}
    for message in messages:
        for delta in message.get("choices", []):
            choice = choices.setdefault(delta["index"], {"text": "", "token_ids": [], "finish_reason": None})
            choice["text"] += delta["text"]
            choice["token_ids"] += delta["token_ids"]
            choice["finish_reason"] = delta["finish_reason"] or choice["finish_reason"]
    return choices


def test_json_schema_output_validates_for_every_choice_sampled_or_greedy(engine):
    engine, outbox = engine
    spec = {"type": "json_schema", "schema": PERSON}
    replies = [submit(engine, "Tell me about a person:", max_tokens=200, n=3, temperature=1.0, seed=seed,
                      structured=spec) for seed in range(3)]
    replies.append(submit(engine, "Person:", max_tokens=200, temperature=0, structured=spec))
    for reply in replies:
        for choice in outputs(outbox, reply).values():
            assert choice["finish_reason"] == "stop", choice
            jsonschema.validate(json.loads(choice["text"]), PERSON)


def test_unconstrained_rows_batched_with_constrained_ones_are_unchanged(engine):
    engine, outbox = engine
    prompts = ["Once upon a time", "The weather today", "In a far land there", "Numbers go"]
    alone = [outputs(outbox, submit(engine, p, max_tokens=24, temperature=0, ignore_eos=True))[0] for p in prompts]
    mixed = []
    for index, prompt in enumerate(prompts):
        mixed.append(submit(engine, prompt, max_tokens=24, temperature=0, ignore_eos=True))
        submit(engine, prompt, max_tokens=200, temperature=1.0, seed=index,
               structured={"type": "json_schema", "schema": PERSON})
    assert [outputs(outbox, reply)[0]["token_ids"] for reply in mixed] == [c["token_ids"] for c in alone]


@pytest.mark.parametrize("spec, check", [
    ({"type": "regex", "pattern": "[0-9]{3}-[a-z]{2,5}"}, lambda t: re.fullmatch("[0-9]{3}-[a-z]{2,5}", t)),
    ({"type": "choice", "choices": ["yes", "no", "maybe not"]}, lambda t: t in ("yes", "no", "maybe not")),
    ({"type": "grammar", "grammar": 'root ::= "(" [a-c] [a-c]? [a-c]? ")"'}, lambda t: re.fullmatch(r"\([a-c]{1,3}\)", t)),
])
def test_regex_choice_and_grammar_hold(engine, spec, check):
    engine, outbox = engine
    reply = submit(engine, "Answer:", max_tokens=40, n=4, temperature=1.0, seed=7, structured=spec)
    for choice in outputs(outbox, reply).values():
        assert check(choice["text"]), choice


def test_tool_call_grammar_gives_arguments_valid_for_the_tool(engine):
    engine, outbox = engine
    parameters = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                  "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["C", "F"]}}}
    tools = [{"name": "get_weather", "parameters": parameters}, {"name": "noop", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}]
    reply = submit(engine, "Call:", max_tokens=80, n=3, temperature=1.0, seed=3,
                   structured={"type": "tool_call", "tools": tools})
    for choice in outputs(outbox, reply).values():
        body = re.fullmatch(r"<tool_call>\n(.*)\n</tool_call>", choice["text"], re.S)
        assert body, choice
        call = json.loads(body.group(1))
        schema = next(t["parameters"] for t in tools if t["name"] == call["name"])
        jsonschema.validate(call["arguments"], schema)


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "pattern": "(?=x)"}, "look-around"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "/nowhere"),
])
def test_a_schema_the_backend_cannot_compile_is_refused_with_the_reason(engine, schema, words):
    engine, outbox = engine
    error = outputs(outbox, submit(engine, "x", structured={"type": "json_schema", "schema": schema}))["error"]
    assert error["status"] == 400 and error["param"] == "response_format" and words in error["message"]


def test_a_compile_past_the_timeout_is_refused_and_the_batch_goes_on(hf_cache):
    with running_engine(hf_cache, EngineConfig(grammar_timeout=0.0)) as (engine, outbox):
        error = outputs(outbox, submit(engine, "x", structured={"type": "json_schema", "schema": PERSON}))["error"]
        assert (error["status"], error["code"]) == (400, "grammar_compile_timeout")
        assert outputs(outbox, submit(engine, "still serving", max_tokens=3, ignore_eos=True))[0]["finish_reason"] == "length"


def test_a_grammar_dead_end_ends_the_choice_with_stop(engine, reference, caplog):
    """The grammar wants one digit and every digit is banned: nothing is allowed, the choice stops (no error)."""
    engine, outbox = engine
    digits = [[reference.tokenizer.convert_tokens_to_ids(d)] for d in "0123456789"]
    reply = submit(engine, "x", max_tokens=5, n=2, bad_words_ids=digits, structured={"type": "regex", "pattern": "[0-9]"})
    assert [(c["text"], c["finish_reason"]) for c in outputs(outbox, reply).values()] == [("", "stop")] * 2
    assert "grammar dead end" in caplog.text


def test_bad_words_and_min_length_follow_hugging_face(engine, reference):
    engine, outbox = engine
    prompt = reference.encode("Once upon a time")
    free = outputs(outbox, submit(engine, prompt, max_tokens=12, temperature=0))[0]["token_ids"]
    banned = [[free[0]], free[2:4]]
    got = outputs(outbox, submit(engine, prompt, max_tokens=12, temperature=0, bad_words_ids=banned))[0]["token_ids"]
    assert got == reference.greedy(prompt, 12, bad_words_ids=banned)
    eos = reference.tokenizer.eos_token_id
    expected = reference.greedy(prompt, 30, min_length=len(prompt) + 20)
    got = outputs(outbox, submit(engine, prompt, max_tokens=30, temperature=0, min_length=len(prompt) + 20))[0]
    assert got["token_ids"] == expected and eos not in got["token_ids"][:20]


def test_typical_p_with_a_seed_is_reproducible(engine):
    engine, outbox = engine
    runs = [outputs(outbox, submit(engine, "Hello", max_tokens=10, temperature=1.0, typical_p=0.5, seed=5,
                                   ignore_eos=True))[0]["token_ids"] for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("num_beams, n, length_penalty, early_stopping", [(4, 1, 1.0, False), (3, 3, 0.5, True)])
def test_beam_search_equals_generate(engine, reference, num_beams, n, length_penalty, early_stopping):
    engine, outbox = engine
    prompt = reference.encode("The little dog")
    reply = submit(engine, prompt, max_tokens=10, n=n, num_beams=num_beams, length_penalty=length_penalty,
                   early_stopping=early_stopping)
    with torch.no_grad():
        expected = reference.model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=10,
            do_sample=False, num_beams=num_beams, num_return_sequences=n, length_penalty=length_penalty,
            early_stopping=early_stopping, pad_token_id=reference.tokenizer.pad_token_id)[:, len(prompt):].tolist()
    eos = reference.tokenizer.eos_token_id
    expected = [row[: row.index(eos) + 1] if eos in row else row for row in expected]
    got = outputs(outbox, reply)
    assert [got[i]["token_ids"] for i in range(n)] == expected


def test_a_beam_request_does_not_hold_up_the_batch(engine):
    engine, outbox = engine
    beam = submit(engine, "A long beam", max_tokens=200, num_beams=6, ignore_eos=False, min_tokens=200)
    quick = submit(engine, "quick", max_tokens=5, ignore_eos=True)
    outputs(outbox, quick)
    assert not finished(outbox.messages.get(beam, []))
    outputs(outbox, beam)
