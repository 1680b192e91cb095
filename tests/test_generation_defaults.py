"""Where a request is silent, sampling defaults come from the model's generation_config.json."""
from __future__ import annotations

import json

import httpx

from workers.tiny.builders import build_tiny_model

from .conftest import Reference
from .live_server import LiveServer, base_env

MODEL = "local/tiny-llama"


def test_generation_config_supplies_defaults_and_the_request_wins(tmp_path):
    cache = tmp_path / "cache"
    snapshot = build_tiny_model(MODEL, size="tiny", cache_dir=cache)
    config_path = snapshot / "generation_config.json"
    config = json.loads(config_path.read_text())
    config.update({"top_k": 1, "repetition_penalty": 1.6})  # top_k 1: greedy unless the request says otherwise
    config_path.unlink()  # a symlink into blobs/: replace it with this model's own file
    config_path.write_text(json.dumps(config))

    reference = Reference(cache)
    prompt_ids = reference.encode("1, 2, 3,")
    with_defaults = reference.greedy(prompt_ids, 20)  # generate applies generation_config.json too
    plain = reference.greedy(prompt_ids, 20, repetition_penalty=1.0)
    assert with_defaults != plain

    live = LiveServer(base_env(cache, tmp_path), tmp_path)
    try:
        def complete(**body):
            response = httpx.post(f"{live.base_url}/v1/completions", headers=live.headers, timeout=60,
                                  json={"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 20, "return_token_ids": True, **body})
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["token_ids"]

        assert complete() == with_defaults
        assert complete(repetition_penalty=1.0) == plain
    finally:
        live.stop()
