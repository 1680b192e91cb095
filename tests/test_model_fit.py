"""A chat or completion to a speech model is refused by the web side from the catalog's scan, before a worker
loads the model to find out (issue 49, item 11)."""
import httpx
import pytest

from .conftest import TINY_WHISPER


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]}),
    ("/v1/completions", {"prompt": "Hello"}),
])
def test_text_generation_from_a_speech_model_is_refused_before_loading(media_server, path, body):
    answer = httpx.post(f"{media_server.base_url}{path}", headers=media_server.headers, timeout=60,
                        json={"model": TINY_WHISPER, "max_tokens": 2, **body})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_modality", "model")
    assert "cannot generate" in error["message"] and "audio" in error["message"]
