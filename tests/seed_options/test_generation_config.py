"""The seeds' options: generation_config, do_sample, max_new_tokens."""
from __future__ import annotations

import json

import httpx

from ..helpers.seed_options import PROMPT, REMOTE, complete, sdk


def test_generation_config_sets_the_fields_it_names_and_the_request_still_wins(keyed, reference):
    config = json.dumps({"do_sample": False, "max_new_tokens": 6, "transformers_version": "5.23.0"})
    response = httpx.post(f"{keyed.base_url}/v1/completions", headers=keyed.headers, timeout=120,
                          json={"prompt": PROMPT, "temperature": 1.5, "generation_config": config})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["completion_tokens"] == 6
    assert body["choices"][0]["text"] == reference.decode(reference.greedy(reference.encode(PROMPT), 6))
    overridden = complete(keyed, tokens=3, generation_config={"max_new_tokens": 6})
    assert overridden.json()["usage"]["completion_tokens"] == 3


def test_do_sample_and_max_new_tokens_as_fields(keyed):
    result = sdk(keyed).chat.completions.create(model=REMOTE, messages=[{"role": "user", "content": "Hi"}],
                                                temperature=1.9, extra_body={"do_sample": False, "max_new_tokens": 5})
    again = sdk(keyed).chat.completions.create(model=REMOTE, messages=[{"role": "user", "content": "Hi"}],
                                               temperature=1.9, extra_body={"do_sample": False, "max_new_tokens": 5})
    assert result.usage.completion_tokens == 5 and result.choices[0].message.content == again.choices[0].message.content


def test_generation_config_keys_this_server_cannot_honour_are_a_400(keyed):
    response = complete(keyed, generation_config=json.dumps({"penalty_alpha": 0.6, "output_scores": True}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "generation_config" and "penalty_alpha" in error["message"]
    assert complete(keyed, generation_config="{not json").status_code == 400
