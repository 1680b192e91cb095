"""LoRA adapters served over their base: the catalog lists them, requests name them, and greedy output equals
`PeftModel.generate`, alone and in a batch mixed with other adapters and the base."""
from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest
import torch
from openai import OpenAI

from workers.tiny.builders import build_tiny_model
from workers.tiny.lora import build_tiny_lora

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env

ADAPTERS = ["local/tiny-lora-a", "local/tiny-lora-b"]
PROMPTS = ["Once upon a time", "The little dog", "In the morning the"]
LONG = "Once upon a time there was a little dog who lived in a house by the sea. " * 6  # several prefix blocks
TOKENS = 16


@pytest.fixture(scope="module")
def lora_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("lora-cache")
    build_tiny_model(TINY_MODEL, cache_dir=cache)
    snapshots = {name: build_tiny_lora(name, TINY_MODEL, cache_dir=cache, seed=seed)
                 for seed, name in enumerate(ADAPTERS, 1)}
    return cache, snapshots


@pytest.fixture(scope="module")
def live(lora_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("lora-server")
    server = LiveServer(base_env(lora_cache[0], work, INFERENCE_WORKER_ACK_TIMEOUT="120"), work)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live) -> OpenAI:
    return OpenAI(base_url=f"{live.base_url}/v1", api_key=live.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def expected(lora_cache) -> dict[tuple[str, str], list[int]]:
    """{(model, prompt): greedy token ids} from transformers (the base) and peft (each adapter)."""
    from huggingface_hub import snapshot_download
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache, snapshots = lora_cache
    base_path = snapshot_download(TINY_MODEL, cache_dir=cache, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    answers = {}

    def greedy(model, prompt):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
        return out[0, ids.shape[1]:].tolist()

    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()
        for prompt in [*PROMPTS, LONG]:
            answers[(TINY_MODEL, prompt)] = greedy(base, prompt)
        for name, snapshot in snapshots.items():
            model = PeftModel.from_pretrained(
                AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32), str(snapshot)).eval()
            for prompt in [*PROMPTS, LONG]:
                answers[(name, prompt)] = greedy(model, prompt)
    return answers


def ids_of(client: OpenAI, model: str, prompt: str) -> list[int]:
    response = client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS, temperature=0,
                                         extra_body={"ignore_eos": True, "return_token_ids": True})
    return response.choices[0].token_ids


def test_adapters_differ_from_their_base(expected):
    for prompt in PROMPTS:
        outputs = {tuple(expected[(model, prompt)]) for model in [TINY_MODEL, *ADAPTERS]}
        assert len(outputs) == 3, prompt


def test_models_list_shows_adapters_with_their_parent(client):
    models = {m.id: m.model_dump() for m in client.models.list().data}
    for name in ADAPTERS:
        assert models[name]["parent"] == TINY_MODEL and models[name]["root"] == name
        assert models[name]["tasks"] == ["generate"]
        assert models[name]["max_model_len"] == models[TINY_MODEL]["max_model_len"] != 2048  # its base's
        assert client.models.retrieve(name).model_dump()["max_model_len"] == models[TINY_MODEL]["max_model_len"]
    assert models[TINY_MODEL]["parent"] is None


def test_each_adapter_alone_equals_peft_generate(client, expected):
    for model in [*ADAPTERS, TINY_MODEL]:
        assert ids_of(client, model, PROMPTS[0]) == expected[(model, PROMPTS[0])], model


def test_adapters_and_base_in_one_batch_equal_peft_generate(client, expected):
    jobs = [(model, prompt) for model in [TINY_MODEL, *ADAPTERS] for prompt in PROMPTS] * 2
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: ids_of(client, *job), jobs))
    for job, ids in zip(jobs, got):
        assert ids == expected[job], job


def test_chat_and_streaming_through_an_adapter(client, expected):
    stream = client.completions.create(model=ADAPTERS[1], prompt=PROMPTS[2], max_tokens=TOKENS, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True, "return_token_ids": True})
    ids = [t for chunk in stream for choice in chunk.choices for t in (choice.token_ids or [])]
    assert ids == expected[(ADAPTERS[1], PROMPTS[2])]
    chat = client.chat.completions.create(model=ADAPTERS[0], messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4, temperature=0)
    assert chat.model == ADAPTERS[0]


def test_beam_search_on_an_adapter_is_refused_clearly(live):
    response = httpx.post(f"{live.base_url}/v1/completions", headers=live.headers, timeout=120,
                          json={"model": ADAPTERS[0], "prompt": "x", "max_tokens": 2, "n": 2, "use_beam_search": True})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] in ("num_beams", "use_beam_search")


def test_prefix_cache_entries_are_keyed_by_adapter(live, client, expected):
    """The same long prompt through the base, then each adapter, then again: every answer is its own
    model's (a base entry reused under an adapter would give the base's keys/values), and repeats hit the cache."""
    def hits() -> float:
        text = httpx.get(f"{live.base_url}/metrics", headers=live.headers, timeout=30).text
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("vllm:prefix_cache_hits") and not line.startswith("#"))
    for model in [TINY_MODEL, *ADAPTERS, TINY_MODEL, *ADAPTERS]:
        assert ids_of(client, model, LONG) == expected[(model, LONG)], model
    assert hits() > 0


def test_unloading_an_adapter_leaves_its_base_and_it_loads_again(live, client, expected):
    assert ids_of(client, ADAPTERS[0], PROMPTS[1]) == expected[(ADAPTERS[0], PROMPTS[1])]
    unload = httpx.post(f"{live.base_url}/unload_model", headers=live.headers, json={"model": ADAPTERS[0]}, timeout=60)
    assert unload.status_code == 200, unload.text
    models = {m.id: m.model_dump() for m in client.models.list().data}
    assert models[TINY_MODEL]["status"] == "loaded"
    assert ids_of(client, TINY_MODEL, PROMPTS[1]) == expected[(TINY_MODEL, PROMPTS[1])]
    assert ids_of(client, ADAPTERS[1], PROMPTS[1]) == expected[(ADAPTERS[1], PROMPTS[1])]
    assert ids_of(client, ADAPTERS[0], PROMPTS[1]) == expected[(ADAPTERS[0], PROMPTS[1])]  # loaded again


def test_unloading_every_adapter_leaves_the_plain_base(live, client, expected):
    for name in ADAPTERS:
        ids_of(client, name, PROMPTS[0])
    for name in ADAPTERS:
        response = httpx.post(f"{live.base_url}/unload_model", headers=live.headers, json={"model": name}, timeout=60)
        assert response.status_code == 200, response.text
    assert ids_of(client, TINY_MODEL, PROMPTS[2]) == expected[(TINY_MODEL, PROMPTS[2])]
    assert ids_of(client, ADAPTERS[1], PROMPTS[2]) == expected[(ADAPTERS[1], PROMPTS[2])]


def test_load_model_of_an_adapter_brings_its_base_once(live, client, expected):
    import json
    import time

    response = httpx.post(f"{live.base_url}/unload_model", headers=live.headers, json={"model": TINY_MODEL}, timeout=60)
    assert response.status_code == 200, response.text  # a base goes with its adapters
    with httpx.stream("POST", f"{live.base_url}/load_model", headers=live.headers, json={"model": ADAPTERS[0]},
                      timeout=120) as stream:
        assert stream.status_code == 200
        events = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1]["status"] == "ready" and events[-1]["model"] == f"{ADAPTERS[0]}@main", events
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        models = {m.id: m.model_dump() for m in client.models.list().data}
        if models[ADAPTERS[0]]["status"] == models[TINY_MODEL]["status"] == "loaded":
            break
        time.sleep(0.2)
    assert models[ADAPTERS[0]]["status"] == models[TINY_MODEL]["status"] == "loaded", models
    assert models[ADAPTERS[1]]["status"] == "cached"
    assert ids_of(client, ADAPTERS[0], PROMPTS[0]) == expected[(ADAPTERS[0], PROMPTS[0])]
    assert ids_of(client, TINY_MODEL, PROMPTS[0]) == expected[(TINY_MODEL, PROMPTS[0])]
