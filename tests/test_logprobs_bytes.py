"""Logprobs of tokens that are part of a multi-byte character use OpenAI's `bytes:\\xNN` form, so the
tokens still join to the text and `text_offset` stays consistent; `add_special_tokens` turns BOS off."""
from __future__ import annotations

from openai_api.shaping import token_bytes

from .conftest import TINY_MODEL

PROMPT = "Café costs 5€ 😀 ok"


def raw(token: str) -> bytes:
    return bytes(token_bytes(token))


def test_echoed_prompt_tokens_join_to_the_prompt_bytes(warm_server, client, reference):
    result = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1,
                                       extra_body={"add_special_tokens": False})
    choice = result.choices[0]
    tokens, offsets = choice.logprobs.tokens, choice.logprobs.text_offset
    assert choice.text == PROMPT
    assert result.usage.prompt_tokens == len(reference.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    assert any(token.startswith("bytes:\\x") for token in tokens), tokens
    assert "\ufffd" not in "".join(tokens)
    assert b"".join(raw(token) for token in tokens) == PROMPT.encode()
    # Each token starts at the character holding its first byte.
    position = 0
    for token, offset in zip(tokens, offsets):
        assert offset == len(PROMPT.encode()[:position].decode("utf-8", errors="ignore")), (token, offset)
        position += len(raw(token))


def test_with_special_tokens_the_echo_starts_with_bos(warm_server, client, reference):
    result = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=0)
    assert result.choices[0].logprobs.tokens[0] == reference.tokenizer.bos_token
    plain = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=0,
                                      extra_body={"add_special_tokens": False})
    assert result.usage.prompt_tokens == plain.usage.prompt_tokens + 1


def test_chat_bytes_of_partial_tokens():
    assert token_bytes("bytes:\\xe2\\x82") == [0xE2, 0x82]
    assert token_bytes("é") == [0xC3, 0xA9]
    assert token_bytes("bytes:\\xzz") == list("bytes:\\xzz".encode())
