"""Chat messages as clients send them (issue 49, item 10): unknown fields (`name`, `cache_control`, vendor keys)
are ignored and custom roles go to the chat template, as vLLM does, where OpenAI's strictness answered 400."""
import httpx

from .conftest import TINY_MODEL


def rendered(server, messages: list[dict]) -> str:
    body = httpx.post(f"{server.base_url}/v1/tokenize", headers={"Authorization": f"Bearer {server.key}"}, timeout=120,
                      json={"model": TINY_MODEL, "messages": messages, "return_token_strs": True})
    assert body.status_code == 200, body.text
    return "".join(body.json()["token_strs"])


def test_unknown_message_fields_are_ignored(server, client):
    messages = [{"role": "system", "content": "Be brief.", "cache_control": {"type": "ephemeral"}},
                {"role": "user", "content": "Hello", "name": "ada", "x_vendor_trace": "abc123"}]
    chat = client.chat.completions.create(model=TINY_MODEL, messages=messages, max_tokens=3, temperature=0)
    assert chat.choices[0].finish_reason in ("stop", "length")
    text = rendered(server, messages)
    assert "Hello" in text and "abc123" not in text and "ephemeral" not in text


def test_a_custom_role_reaches_the_template(server, client):
    messages = [{"role": "narrator", "content": "Night falls."}, {"role": "user", "content": "Go on"}]
    chat = client.chat.completions.create(model=TINY_MODEL, messages=messages, max_tokens=3, temperature=0)
    text = rendered(server, messages)
    assert "<|im_start|>narrator\nNight falls." in text
    tokens = httpx.post(f"{server.base_url}/v1/tokenize", headers={"Authorization": f"Bearer {server.key}"},
                        timeout=120, json={"model": TINY_MODEL, "messages": messages}).json()["tokens"]
    assert chat.usage.prompt_tokens == len(tokens), "the chat was rendered with the custom role, as tokenize renders it"


def test_a_role_that_is_not_a_name_is_still_refused(server):
    answer = httpx.post(f"{server.base_url}/v1/chat/completions", headers={"Authorization": f"Bearer {server.key}"},
                        timeout=60, json={"model": TINY_MODEL, "max_tokens": 2,
                                          "messages": [{"role": 42, "content": "Hello"}]})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages[0].role"
