"""/tokenize and /detokenize: the worker's tokenizer and chat template, vLLM's shapes."""
from __future__ import annotations

import httpx
import pytest

from .conftest import TINY_MODEL
from .helpers.errors import assert_openai_error

MESSAGES = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell me a story."}]


def post(server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}/{path}", json=body, headers=server.headers if headers is None else headers,
                      timeout=60)


def test_tokenize_text_matches_the_tokenizer_and_completion_usage(server, client, reference):
    prompt = "Once upon a time"
    body = post(server, "tokenize", {"model": TINY_MODEL, "prompt": prompt}).json()
    assert body["tokens"] == reference.encode(prompt)
    assert body["count"] == len(body["tokens"])
    assert body["max_model_len"] == reference.model.config.max_position_embeddings
    usage = client.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=1).usage
    assert usage.prompt_tokens == body["count"]
    bare = post(server, "tokenize", {"model": TINY_MODEL, "prompt": prompt, "add_special_tokens": False}).json()
    assert bare["tokens"] == reference.tokenizer(prompt, add_special_tokens=False)["input_ids"]


def test_tokenize_messages_matches_the_template_and_chat_usage(server, client, reference):
    body = post(server, "tokenize", {"model": TINY_MODEL, "messages": MESSAGES}).json()
    expected = reference.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False)
    assert body["tokens"] == expected
    usage = client.chat.completions.create(model=TINY_MODEL, messages=MESSAGES, max_tokens=1).usage
    assert usage.prompt_tokens == body["count"]
    no_prompt = post(server, "tokenize", {"model": TINY_MODEL, "messages": MESSAGES, "add_generation_prompt": False})
    assert no_prompt.json()["count"] < body["count"]


def test_detokenize_inverts_tokenize(server, reference):
    ids = reference.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    body = post(server, "detokenize", {"model": TINY_MODEL, "tokens": ids}).json()
    assert body == {"prompt": reference.tokenizer.decode(ids)}
    assert post(server, "detokenize", {"model": TINY_MODEL, "tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize("path,body,status,param", [
    ("tokenize", {"model": TINY_MODEL}, 400, "prompt"),
    ("tokenize", {"model": TINY_MODEL, "prompt": "a", "messages": MESSAGES}, 400, "prompt"),
    ("tokenize", {"model": TINY_MODEL, "prompt": 5}, 400, "prompt"),
    ("tokenize", {"model": TINY_MODEL, "prompt": "a", "extra": 1}, 400, "extra"),
    ("tokenize", {"model": TINY_MODEL, "messages": [{"role": "no body"}]}, 400, "messages[0].role"),
    ("tokenize", {"model": "nobody/nothing", "prompt": "a"}, 404, "model"),
    ("detokenize", {"model": TINY_MODEL, "tokens": [-1]}, 400, "tokens"),
    ("detokenize", {"model": TINY_MODEL, "tokens": [10**9]}, 400, "tokens"),
    ("detokenize", {"model": TINY_MODEL, "tokens": "12"}, 400, "tokens"),
])
def test_bad_tokenize_requests_are_openai_errors(server, path, body, status, param):
    assert_openai_error(post(server, path, body), status, param=param)


def test_tokenize_needs_the_key(server):
    assert_openai_error(post(server, "tokenize", {"model": TINY_MODEL, "prompt": "a"}, headers={}), 401)
