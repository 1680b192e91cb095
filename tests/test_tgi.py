"""TGI's routes through huggingface_hub's own InferenceClient, against /v1/completions' greedy output."""
from __future__ import annotations

import httpx
import pytest
from huggingface_hub import InferenceClient

from .conftest import TINY_MODEL

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def hub(warm_server) -> InferenceClient:
    return InferenceClient(base_url=warm_server.base_url, api_key=warm_server.key, timeout=120)


@pytest.fixture(scope="module")
def greedy(client) -> tuple[str, list[int]]:
    answer = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    return answer.choices[0].text, answer.choices[0].token_ids


def test_text_generation_equals_greedy_completions(hub, greedy):
    text, ids = greedy
    plain = hub.text_generation(PROMPT, max_new_tokens=12)
    assert plain and plain == text[:len(plain)]
    out = hub.text_generation(PROMPT, max_new_tokens=12, details=True)
    assert [t.id for t in out.details.tokens] == ids[:len(out.details.tokens)]
    assert out.generated_text == text[:len(out.generated_text)]
    assert out.details.generated_tokens == len(out.details.tokens)
    assert all(t.logprob is not None and t.logprob <= 0 for t in out.details.tokens)


def test_text_generation_streams_tokens_then_the_whole_text(hub, greedy):
    events = list(hub.text_generation(PROMPT, max_new_tokens=12, stream=True, details=True))
    assert [e.token.id for e in events] == greedy[1][:len(events)]
    assert events[-1].generated_text == "".join(e.token.text for e in events)
    assert events[-1].details.generated_tokens == len(events)
    assert all(e.generated_text is None for e in events[:-1])


def test_generate_info_and_errors(warm_server):
    base, headers = warm_server.base_url, warm_server.headers
    body = httpx.post(f"{base}/generate", headers=headers, timeout=60,
                      json={"inputs": PROMPT, "parameters": {"max_new_tokens": 3, "details": True}}).json()
    assert body["details"]["generated_tokens"] <= 3 and isinstance(body["generated_text"], str)
    info = httpx.get(f"{base}/info", headers=headers, timeout=30).json()
    assert info["model_id"] == TINY_MODEL and info["router"] == "text-generation-router"
    for path, payload in [("/generate", {"inputs": 5}), ("/", {"parameters": {}}),
                          ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": -1}})]:
        response = httpx.post(f"{base}{path}", headers=headers, json=payload, timeout=30)
        assert response.status_code == 400 and "error" in response.json(), (path, response.text)
    for parameters in ({"max_new_tokens": -1}, {"max_new_tokens": 0}, {"max_new_tokens": "3"},
                       {"max_new_tokens": 10**6}):  # TGI's own field is named, never max_tokens
        response = httpx.post(f"{base}/generate", headers=headers, json={"inputs": "x", "parameters": parameters},
                              timeout=60)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "parameters.max_new_tokens", response.text
        assert "max_new_tokens" in error["message"] and "max_tokens" not in error["message"], response.text
    response = httpx.post(f"{base}/generate", headers=headers, json={"inputs": "x", "parameters": {"top_k": "a"}},
                          timeout=30)
    assert response.json()["error"]["param"] == "parameters.top_k", response.text
    assert httpx.post(f"{base}/generate", json={"inputs": "x"}, timeout=30).status_code == 401
    assert httpx.get(f"{base}/", timeout=30).headers["content-type"].startswith("text/html")
