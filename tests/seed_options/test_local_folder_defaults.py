"""The seeds' options: a local folder, pinned, quantized server-wide."""
from __future__ import annotations

import json
import os

import httpx

from ..helpers.seed_options import PROMPT, sdk, wait_loaded


def test_a_local_folder_is_served_pinned_and_quantized(open_server):
    model = wait_loaded(open_server, "local/my-model")
    result = sdk(open_server).chat.completions.create(model="local/my-model", max_tokens=4,
                                                      messages=[{"role": "user", "content": "Hi"}])
    assert 1 <= result.usage.completion_tokens <= 4  # this server's stop sequence may end it sooner
    assert "quantized torchao-int8" in open_server.log()
    assert model["memory_bytes"] < 0.8 * model["size_bytes"]
    assert "weights from the checkpoint" in open_server.log() and "checkpoint-200" in open_server.log()


def test_the_latest_checkpoint_is_the_newest_that_holds_weights(tmp_path):
    """forgather's manifest timestamp first, else the folder's mtime, then the step; the Trainer's layout too."""
    from catalog.local_folders import latest_checkpoint

    def checkpoint(name: str, saved: str | None = None, weights: str = "model.safetensors"):
        path = tmp_path / name
        path.mkdir(parents=True)
        (path / weights).write_bytes(b"w")
        if saved:
            (path / "checkpoint_manifest.json").write_text(json.dumps({"timestamp": saved}))
        return path

    assert latest_checkpoint(tmp_path) is None
    checkpoint("checkpoint-50", weights="optimizer.pt")  # holds no weights
    trainer = checkpoint("checkpoint-40", weights="pytorch_model.bin")
    assert latest_checkpoint(tmp_path) == trainer
    older = checkpoint("checkpoints/checkpoint-900", saved="2026-01-01T00:00:00")
    newer = checkpoint("checkpoints/checkpoint-300", saved="2026-02-01T00:00:00")
    os.utime(trainer, (1, 1))
    os.utime(older, (2**31, 2**31))  # its manifest wins over its mtime
    assert latest_checkpoint(tmp_path) == newer


def test_server_wide_request_defaults(open_server):
    client = sdk(open_server)
    unseeded = [client.completions.create(model="local/my-model", prompt=PROMPT, max_tokens=12, temperature=1.0)
                for _ in range(2)]
    assert unseeded[0].choices[0].text == unseeded[1].choices[0].text  # --default-seed 7
    assert "a" not in unseeded[0].choices[0].text  # --stop-sequences a, beside the request's (none)
    eos = open_server_tokenizer_eos(open_server)
    forced = client.completions.create(model="local/my-model", prompt=PROMPT, max_tokens=5, temperature=0,
                                       logit_bias={str(eos): 100}, stop=None)
    assert forced.usage.completion_tokens == 5 and forced.choices[0].finish_reason == "length"  # --ignore-eos
    said = client.completions.create(model="local/my-model", prompt=PROMPT, max_tokens=5, temperature=0,
                                     logit_bias={str(eos): 100}, extra_body={"ignore_eos": False})
    assert said.usage.completion_tokens <= 1 and said.choices[0].finish_reason == "stop"  # the request wins
    assert " DEBUG " in open_server.log()  # --log-level debug


def open_server_tokenizer_eos(server) -> int:
    body = httpx.post(f"{server.base_url}/v1/tokenize", json={"model": "local/my-model", "prompt": "<|eos|>",
                                                              "add_special_tokens": False}, timeout=60).json()
    assert len(body["tokens"]) == 1, body  # /v1/tokenize: forgather's path for /tokenize
    return body["tokens"][0]


def test_message_extras_and_custom_roles_reach_the_template_when_asked(open_server, keyed):
    messages = [{"role": "my-custom-role", "content": "Be brief."},
                {"role": "user", "content": "Hello", "mood": "cheerful"}]
    body = httpx.post(f"{open_server.base_url}/v1/tokenize", timeout=60, json={
        "model": "local/my-model", "messages": messages, "return_token_strs": True}).json()
    rendered = "".join(body["token_strs"])
    assert "[cheerful]" in rendered and "<|im_start|>my-custom-role" in rendered, rendered
    chat = sdk(open_server).chat.completions.create(model="local/my-model", messages=messages, max_tokens=2)
    assert chat.usage.prompt_tokens == body["count"]  # the template the chat ran saw the extras too
    # The default (issue 49): the custom role still reaches the template, the unknown field is ignored.
    default = httpx.post(f"{keyed.base_url}/tokenize", headers=keyed.headers, timeout=60,
                         json={"messages": messages, "return_token_strs": True})
    assert default.status_code == 200, default.text
    default_render = "".join(default.json()["token_strs"])
    assert "<|im_start|>my-custom-role" in default_render and "cheerful" not in default_render, default_render
