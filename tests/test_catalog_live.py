"""The model catalog against real servers: scans, /load_model, idle timeouts, preload, a memory budget."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from openai import AsyncOpenAI


from .live_server import LiveServer
from .helpers.catalog import catalog_cache, catalog_env, complete, listed, load_events, manage, set_fields, wait_until  # noqa: F401

CAUSAL = ["local/other", "local/third", "local/tiny-llama"]


@pytest.fixture(scope="module")
def live(catalog_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("catalog-server")
    server = LiveServer(catalog_env(catalog_cache, work), work)
    yield server
    server.stop()


def test_scan_finds_models_and_ignores_non_causal_ones(live, catalog_cache, tmp_path):
    env = catalog_env(catalog_cache, tmp_path)
    manage(env, "migrate", "--verbosity", "0")
    output = manage(env, "scan_cache")
    for repo_id in [*CAUSAL, "local/encoder"]:
        assert f"added   {repo_id}" in output
    assert "scanned: 4 added, 0 updated, 0 gone" in output
    models = listed(live)
    assert sorted(models) == CAUSAL
    for model in models.values():
        assert model["object"] == "model"
        assert model["size_bytes"] > 100_000
        assert model["status"] in ("cached", "loading", "loaded")
    response = httpx.post(f"{live.base_url}/load_model", headers=live.headers, json={"model": "local/encoder"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


def test_load_model_streams_stages_then_ready_and_is_cached_the_second_time(live):
    events = load_events(live, "local/third")
    assert all(e["model"] == "local/third@main" for e in events)
    stages = [e["stage"] for e in events if e["status"] == "loading"]
    assert stages[:2] == ["processor", "config"]
    assert "download" not in stages  # the files are cached
    weights = [e["progress"] for e in events if e.get("stage") == "weights"]
    assert weights and weights[-1]["current"] == weights[-1]["total"] > 1
    assert [w["current"] for w in weights] == sorted(w["current"] for w in weights)
    assert events[-1] == {"status": "ready", "model": "local/third@main", "cached": False}
    assert load_events(live, "local/third@main") == [{"status": "ready", "model": "local/third@main", "cached": True}]
    model = wait_until(lambda: (m := listed(live)["local/third"])["status"] == "loaded" and m,
                       what="local/third listed as loaded")
    assert len(model["loaded_on"]) == 1


def test_load_model_errors_are_openai_shaped(live):
    response = httpx.post(f"{live.base_url}/load_model", headers=live.headers, json={"model": "nobody/nothing"})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"
    response = httpx.post(f"{live.base_url}/load_model", headers=live.headers, json={"model": "local/third", "x": 1})
    assert response.status_code == 400 and response.json()["error"]["param"] == "x"
    # Without a key only a model that is loaded is answered (ready: transformers chat's call); no other name is
    # even looked up.
    assert httpx.post(f"{live.base_url}/load_model", json={"model": "nobody/nothing"}).status_code == 401
    assert httpx.post(f"{live.base_url}/unload_model", json={"model": "local/third"}).status_code == 401


def test_concurrent_first_requests_trigger_one_load(live):
    async def burst():
        client = AsyncOpenAI(base_url=f"{live.base_url}/v1", api_key=live.key, max_retries=0, timeout=120)
        return await asyncio.gather(*[client.completions.create(model="local/other", prompt=f"Story {i}:",
                                                                max_tokens=3, extra_body={"ignore_eos": True})
                                     for i in range(8)])

    results = asyncio.run(burst())
    # ignore_eos: batched in whichever way they arrive, a random model's near-tie may pick its EOS.
    assert [r.usage.completion_tokens for r in results] == [3] * 8
    assert live.log().count("loaded local/other@main on") == 1


def test_unload_model_frees_it_and_says_where(live):
    assert load_events(live, "local/tiny-llama")[-1]["status"] == "ready"
    response = httpx.post(f"{live.base_url}/unload_model", headers=live.headers, json={"model": "local/tiny-llama"})
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "unloaded" and body["model"] == "local/tiny-llama@main" and len(body["unloaded_on"]) == 1
    again = httpx.post(f"{live.base_url}/unload_model", headers=live.headers, json={"model": "local/tiny-llama"})
    assert again.json()["status"] == "not_loaded"
    wait_until(lambda: listed(live)["local/tiny-llama"]["status"] == "cached", what="tiny-llama back to cached")
    assert load_events(live, "local/tiny-llama")[-1] == {"status": "ready", "model": "local/tiny-llama@main",
                                                         "cached": False}


def test_unloading_a_generating_model_is_refused_with_409(live):
    body = {"model": "local/third", "prompt": "Once", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{live.base_url}/v1/completions", headers=live.headers, json=body, timeout=60) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # generating now
        response = httpx.post(f"{live.base_url}/unload_model", headers=live.headers, json={"model": "local/third"})
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "model_busy"
    assert listed(live)["local/third"]["status"] == "loaded"


def test_idle_models_unload_and_preloaded_ones_stay(catalog_cache, tmp_path):
    env = catalog_env(catalog_cache, tmp_path)
    set_fields(env, "local/tiny-llama", preload=True)
    set_fields(env, "local/third", generation_defaults={"top_k": 1},
               chat_template="{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    server = LiveServer(env, tmp_path, extra_args=("--model-timeout", "1"))
    try:
        server.wait_for_log("loaded local/tiny-llama@main on")  # preloaded at worker start, before any request
        assert load_events(server, "local/other")[-1]["status"] == "ready"
        server.wait_for_log("unloaded local/other@main (idle)", timeout=15)
        time.sleep(1.5)
        models = listed(server)
        assert models["local/other"]["status"] == "cached"
        assert models["local/tiny-llama"]["status"] == "loaded"
        assert "unloaded local/tiny-llama" not in server.log()
        assert complete(server, "local/tiny-llama").status_code == 200
        # The catalog's default generation parameters apply under the request's own: top_k 1 is greedy.
        greedy = complete(server, "local/third").json()["choices"][0]["text"]
        explicit = httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=60, json={
            "model": "local/third", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}).json()
        assert greedy == explicit["choices"][0]["text"]
        sampled = {httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=60, json={
            "model": "local/third", "prompt": "Once upon a time", "max_tokens": 4, "top_k": 0, "seed": seed,
        }).json()["choices"][0]["text"] for seed in range(4)}
        assert len(sampled) > 1  # the request wins over the catalog's top_k
        # The catalog's chat template replaces the model's own.
        tokens = httpx.post(f"{server.base_url}/tokenize", headers=server.headers, timeout=60, json={
            "model": "local/third", "messages": [{"role": "user", "content": "hello world"}]}).json()["tokens"]
        text = httpx.post(f"{server.base_url}/detokenize", headers=server.headers, timeout=60,
                          json={"model": "local/third", "tokens": tokens}).json()["prompt"]
        assert text == "[hello world]"
    finally:
        server.stop()


def test_memory_budget_evicts_the_least_recently_used_idle_model(catalog_cache, tmp_path):
    # Each tiny model holds ~0.9 MiB: two fit in 2 MiB, a third pushes out the least recently used.
    server = LiveServer(catalog_env(catalog_cache, tmp_path, INFERENCE_WORKER_MEMORY_BUDGET_MB="2"), tmp_path)
    try:
        assert complete(server, "local/tiny-llama").status_code == 200
        assert complete(server, "local/other").status_code == 200
        assert complete(server, "local/tiny-llama").status_code == 200  # now `other` is the least recent
        assert complete(server, "local/third").status_code == 200
        assert "unloaded local/other@main (evict:local/third@main)" in server.log()
        assert "unloaded local/tiny-llama" not in server.log()
    finally:
        server.stop()


def test_a_model_over_the_budget_gets_a_clear_503(catalog_cache, tmp_path):
    server = LiveServer(catalog_env(catalog_cache, tmp_path, INFERENCE_WORKER_MEMORY_BUDGET_MB="0.5"), tmp_path)
    try:
        response = complete(server, "local/other")
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "insufficient_memory" and "memory budget" in error["message"]
        events = load_events(server, "local/other")
        assert events[-1]["status"] == "error" and events[-1]["code"] == "insufficient_memory"
    finally:
        server.stop()
