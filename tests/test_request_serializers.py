"""Request serializers bind only the fields a request uses (openai_api/serializers/fields.py): what they
accept, what they make of it and what they refuse equal DRF's own way, which copies, binds and runs
every declared field (`lazy_fields = False`)."""
from __future__ import annotations

import pytest

from openai_api.base import serializer_context
from openai_api.serializers.chat import ChatRequestSerializer
from openai_api.serializers.completions import CompletionRequestSerializer
from openai_api.serializers.embeddings import EmbeddingRequestSerializer
from openai_api.serializers.fields import RejectUnknownFieldsMixin
from openai_api.serializers.responses import ResponsesRequestSerializer
from openai_api.serializers.score import RerankRequestSerializer
from openai_api.serializers.tokenize import TokenizeRequestSerializer
from webui.serializers import ConversationSerializer, TurnsSerializer

CHAT = [{"role": "user", "content": "Hi"}]
BODIES = [
    (CompletionRequestSerializer, {"model": "m", "prompt": "Once"}),
    (CompletionRequestSerializer, {"model": "m", "prompt": ["a", "b"], "max_tokens": 5, "temperature": 0.3,
                                   "top_p": 0.9, "n": 2, "stop": ["\n"], "logprobs": 2, "echo": True, "seed": 4,
                                   "stream": True, "stream_options": {"include_usage": True},
                                   "logit_bias": {"12": 3}, "ignore_eos": True, "metadata": {"k": "v"}}),
    (CompletionRequestSerializer, {"model": "m", "prompt": [1, 2, 3], "stop": "x", "best_of": 2,
                                   "response_format": {"type": "json_object"}}),
    (CompletionRequestSerializer, {"model": "m", "prompt": "x", "max_tokens": "5"}),
    (CompletionRequestSerializer, {"model": "m", "prompt": "x", "temperature": 9, "n": 0, "stop": 3}),
    (CompletionRequestSerializer, {"prompt": "no model"}),
    (CompletionRequestSerializer, {"model": "m", "prompt": "x", "stream_options": {"bogus": 1}}),
    (ChatRequestSerializer, {"model": "m", "messages": CHAT}),
    (ChatRequestSerializer, {"model": "m", "messages": CHAT, "max_completion_tokens": 3, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "auto",
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
        "store": True, "reasoning_effort": "low", "service_tier": "flex", "parallel_tool_calls": False,
        "top_logprobs": 2, "logprobs": True, "user": "u", "presence_penalty": 0.5}),
    (ChatRequestSerializer, {"model": "m", "messages": "not a list"}),
    (ChatRequestSerializer, {"model": "m", "messages": CHAT, "tool_choice": "auto"}),
    (ChatRequestSerializer, {"model": "m", "messages": CHAT, "logprobs": "yes", "top_logprobs": 99}),
    (ResponsesRequestSerializer, {"model": "m", "input": "Hello"}),
    (ResponsesRequestSerializer, {"model": "m", "input": [{"role": "user", "content": "Hi"}], "instructions": "Be brief",
                                  "max_output_tokens": 16, "text": {"format": {"type": "json_object"}},
                                  "reasoning": {"effort": "low"}, "store": False, "background": False}),
    (ResponsesRequestSerializer, {"model": "m", "input": 3}),
    (EmbeddingRequestSerializer, {"model": "m", "input": ["a", "b"], "encoding_format": "base64"}),
    (EmbeddingRequestSerializer, {"model": "m", "input": "a", "dimensions": "x"}),
    (RerankRequestSerializer, {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1}),
    (TokenizeRequestSerializer, {"model": "m", "prompt": "x"}),
    (TokenizeRequestSerializer, {"model": "m", "messages": CHAT, "add_generation_prompt": True}),
    # The chat page's stores: serializers that build their own fields (a message's versions nest messages).
    (TurnsSerializer, {"version": 2, "at": 0, "messages": [
        {"role": "user", "content": "Tell me about the sea.", "versions": [
            {"message": {"role": "user", "content": "Tell me a story."},
             "tail": [{"role": "assistant", "content": "Once", "version_index": 0}]}]}]}),
    (TurnsSerializer, {"version": 2, "at": 0, "messages": [{"role": "user", "versions": [{"message": {}}]}]}),
    (ConversationSerializer, {"title": "t", "messages": [{"role": "user", "content": "Hi"}], "options": {"top_p": 1}}),
]


def read_the_drf_way(serializer_class: type, body: dict, context: dict):
    """`body` validated with every request serializer (nested ones too) in DRF's own way."""
    with pytest.MonkeyPatch.context() as switch:
        switch.setattr(RejectUnknownFieldsMixin, "lazy_fields", False)
        theirs = serializer_class(data=body, context=context)
        theirs.is_valid()
        return theirs.errors, (theirs.validated_data if not theirs.errors else None), set(theirs.fields)


@pytest.mark.parametrize(("serializer_class", "body"), BODIES,
                         ids=[f"{cls.__name__}-{i}" for i, (cls, _) in enumerate(BODIES)])
def test_a_request_is_read_as_drf_reads_it(serializer_class, body):
    context = serializer_context()
    errors, validated, every_field = read_the_drf_way(serializer_class, body, context)
    ours = serializer_class(data=body, context=context)
    ours.is_valid()
    assert ours.errors == errors
    if not errors:
        assert ours.validated_data == validated
    bound = getattr(ours.fields, "fields", ours.fields)  # the fields this request bound (all, the DRF way)
    assert set(body) <= set(bound) <= every_field or errors


def test_fields_of_one_request_are_not_shared_with_the_next():
    first = ChatRequestSerializer(data={"model": "m", "messages": CHAT, "n": 2}, context=serializer_context())
    second = ChatRequestSerializer(data={"model": "m", "messages": CHAT}, context=serializer_context())
    assert first.is_valid(), first.errors
    assert second.is_valid(), second.errors
    assert len(second.fields.fields) < 15 < len(second.fields), "absent fields with plain defaults were bound"
    assert first.fields["n"] is not second.fields["n"]
    assert first.fields["messages"].parent is first and second.fields["messages"].parent is second
    assert (first.validated_data["n"], second.validated_data["n"]) == (2, 1)
    assert list(first.fields) == list(ChatRequestSerializer._declared_fields)  # every field, in order
