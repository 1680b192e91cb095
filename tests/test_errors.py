"""Bad input gets OpenAI's error shape with the right status, and the server keeps serving."""
from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import TINY_MODEL
from .helpers.errors import assert_openai_error


def post(server, body, headers=None, raw: bytes | None = None):
    headers = {**server.headers, "Content-Type": "application/json", **(headers or {})}
    if raw is not None:
        return httpx.post(f"{server.base_url}/v1/completions", content=raw, headers=headers, timeout=60)
    return httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=60)


BAD_BODIES = [
    ({"prompt": "hi"}, "model"),
    ({"model": TINY_MODEL}, "prompt"),
    ({"model": TINY_MODEL, "prompt": ""}, "prompt"),
    ({"model": TINY_MODEL, "prompt": []}, "prompt"),
    ({"model": TINY_MODEL, "prompt": [[]]}, "prompt"),
    ({"model": TINY_MODEL, "prompt": [1, "a"]}, "prompt"),
    ({"model": TINY_MODEL, "prompt": {"text": "hi"}}, "prompt"),
    ({"model": TINY_MODEL, "prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ({"model": TINY_MODEL, "prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ({"model": TINY_MODEL, "prompt": "hi", "max_tokens": 1.5}, "max_tokens"),
    ({"model": TINY_MODEL, "prompt": "hi", "temperature": 3}, "temperature"),
    ({"model": TINY_MODEL, "prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"model": TINY_MODEL, "prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"model": TINY_MODEL, "prompt": "hi", "n": 0}, "n"),
    ({"model": TINY_MODEL, "prompt": "hi", "n": 1000}, "n"),
    ({"model": TINY_MODEL, "prompt": "hi", "logprobs": 21}, "logprobs"),  # over max_logprobs (20)
    ({"model": TINY_MODEL, "prompt": "hi", "stream": "yes"}, "stream"),
    ({"model": TINY_MODEL, "prompt": "hi", "stop": [1, 2]}, "stop"),
    ({"model": TINY_MODEL, "prompt": "hi", "stop": [""]}, "stop"),
    ({"model": TINY_MODEL, "prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias"),
    ({"model": TINY_MODEL, "prompt": "hi", "logit_bias": {"5": 500}}, "logit_bias"),
    ({"model": TINY_MODEL, "prompt": "hi", "presence_penalty": 9}, "presence_penalty"),
    ({"model": TINY_MODEL, "prompt": "hi", "best_of": 3}, "best_of"),
    ({"model": TINY_MODEL, "prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"model": TINY_MODEL, "prompt": "hi", "stream": True, "stream_options": {"bogus": 1}}, "stream_options.bogus"),
    ({"model": TINY_MODEL, "prompt": "hi", "frobnicate": True}, "frobnicate"),
    ({"model": TINY_MODEL, "prompt": "hi", "top_k": -5}, "top_k"),
    ({"model": TINY_MODEL, "prompt": "hi", "seed": 2**70}, "seed"),
]


@pytest.mark.parametrize("body,param", BAD_BODIES)
def test_invalid_fields_are_400_with_the_param_named(server, body, param):
    assert_openai_error(post(server, body), 400, param=param)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"just a string"', b""])
def test_bodies_that_are_not_a_json_object_are_400(server, raw):
    assert_openai_error(post(server, None, raw=raw), 400)


def test_prompt_plus_max_tokens_over_the_context_is_400(server):
    error = assert_openai_error(post(server, {"model": TINY_MODEL, "prompt": "hi", "max_tokens": 100_000}), 400,
                                code="context_length_exceeded")
    assert "maximum context length is 512" in error["message"]
    long_prompt = " ".join(["word"] * 2000)
    assert_openai_error(post(server, {"model": TINY_MODEL, "prompt": long_prompt}), 400, param="prompt",
                        code="context_length_exceeded")
    streaming = post(server, {"model": TINY_MODEL, "prompt": long_prompt, "stream": True})
    assert_openai_error(streaming, 400, code="context_length_exceeded")


def test_token_ids_and_logit_bias_outside_the_vocabulary_are_400(server):
    assert_openai_error(post(server, {"model": TINY_MODEL, "prompt": [1, 10**9]}), 400, param="prompt")
    assert_openai_error(post(server, {"model": TINY_MODEL, "prompt": "hi", "logit_bias": {"99999999": 1}}), 400,
                        param="logit_bias")


def test_unknown_model_is_404(server, client):
    assert_openai_error(post(server, {"model": "nobody/no-such-model", "prompt": "hi"}), 404, param="model",
                        code="model_not_found")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nobody/no-such-model", prompt="hi")


def test_missing_or_wrong_key_is_401(server):
    assert_openai_error(post(server, {"model": TINY_MODEL, "prompt": "hi"}, headers={"Authorization": ""}), 401)
    assert_openai_error(post(server, {"model": TINY_MODEL, "prompt": "hi"}, headers={"Authorization": "Bearer sk-wrong"}), 401,
                        code="invalid_api_key")
    assert_openai_error(post(server, {"model": TINY_MODEL, "prompt": "hi"}, headers={"Authorization": "Basic abc"}), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-wrong", max_retries=0).completions.create(
            model=TINY_MODEL, prompt="hi")


def test_body_over_the_limit_is_413(server):
    huge = b'{"model": "%s", "prompt": "%s"}' % (TINY_MODEL.encode(), b"a" * (3 * 1024 * 1024))
    assert_openai_error(post(server, None, raw=huge), 413)


def test_unknown_path_and_wrong_method_are_openai_shaped(server):
    assert_openai_error(httpx.get(f"{server.base_url}/v1/nothing-here", headers=server.headers), 404)
    assert_openai_error(httpx.get(f"{server.base_url}/v1/completions", headers=server.headers), 405)


def test_server_keeps_serving_after_bad_input(server, client):
    for body, _ in BAD_BODIES[:5]:
        post(server, body)
    result = client.completions.create(model=TINY_MODEL, prompt="still here", max_tokens=3)
    assert result.usage.completion_tokens == 3
    assert "Traceback" not in server.log()
