"""The seeds' options: the pinned model, its own code, the attention choice."""
from __future__ import annotations

from ..helpers.seed_options import PROMPT, REMOTE, UNTRUSTED, complete, wait_loaded


def test_pinned_model_is_preloaded_and_requests_may_leave_model_out(keyed, reference):
    model = wait_loaded(keyed, REMOTE)  # preloaded at start, nobody asked
    assert model["memory_bytes"] > 0
    response = complete(keyed)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == REMOTE
    # Its own code is Llama's, attention eager here: the tiny Llama's greedy text, token for token.
    assert body["choices"][0]["text"] == reference.decode(reference.greedy(reference.encode(PROMPT), 8))
    assert "with trust_remote_code" in keyed.log() and "attention eager" in keyed.log()


def test_a_repo_with_its_own_code_is_refused_unless_trusted(keyed):
    response = complete(keyed, model=UNTRUSTED)
    assert response.status_code == 503, response.text
    message = response.json()["error"]["message"]
    assert "trust_remote_code" in message and "its own Python code" in message
