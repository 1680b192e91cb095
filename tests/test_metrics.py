"""`/metrics`: vLLM-named values move as requests run, for a key or an allow-listed address only."""
from __future__ import annotations

import time

import httpx

from .conftest import TINY_MODEL
from .helpers.metrics import MODEL_LABEL, scrape, value


def test_engine_metrics_move_with_the_requests_served(warm_server, client):
    server = warm_server
    before = scrape(server)
    usages = []
    for max_tokens in (3, 5, 7):
        usages.append(client.completions.create(model=TINY_MODEL, prompt="count me", max_tokens=max_tokens,
                                                extra_body={"ignore_eos": True}).usage)
    stream = client.chat.completions.create(model=TINY_MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    usages.append([chunk.usage for chunk in stream if chunk.usage][0])
    after = scrape(server)

    def delta(name: str, labels: str = MODEL_LABEL) -> float:
        return value(after, name, labels) - value(before, name, labels)

    assert delta("vllm:time_to_first_token_seconds_count") == 4
    assert delta("vllm:e2e_request_latency_seconds_count") == 4
    assert delta("vllm:request_queue_time_seconds_count") == 4
    assert delta("vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages) == 3 + 5 + 7 + 4
    # Between the tokens of one choice: one fewer interval than tokens, per request.
    assert delta("vllm:inter_token_latency_seconds_count") == (3 + 5 + 7 + 4) - 4
    assert delta("vllm:request_success_total", MODEL_LABEL + ';finished_reason="length"') == 4
    assert delta("vllm:time_to_first_token_seconds_sum") > 0
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:num_requests_waiting") == 0
    assert delta("inference_batch_size_count", "") >= 3 + 5 + 7 + 4 - 4  # one decode step per later token
    assert delta("inference_http_requests_total", 'endpoint="/v1/completions";status="200"') == 3
    assert delta("inference_http_requests_total", 'endpoint="/v1/chat/completions";status="200"') == 1
    assert value(after, "inference_workers", 'status="online"') == 1
    assert value(after, "inference_model_loaded", MODEL_LABEL) == 1
    assert value(after, "inference_model_load_seconds_count") >= 1
    # The engine's time by step phase (workers/engine/step_clock.py), published as it goes.
    deadline = time.monotonic() + 10
    while delta("inference_step_phase_seconds_total", 'phase="forward"') <= 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        after = scrape(server)
    assert delta("inference_step_phase_seconds_total", 'phase="forward"') > 0
    assert delta("inference_step_phase_seconds_total", 'phase="sample"') > 0


def test_metrics_need_a_key_or_an_allowed_address(hf_cache, tmp_path):
    from .live_server import LiveServer, base_env

    live = LiveServer(base_env(hf_cache, tmp_path, INFERENCE_METRICS_ALLOW="10.0.0.0/8"), tmp_path, name="metrics")
    try:
        refused = httpx.get(f"{live.base_url}/metrics", timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{live.base_url}/metrics", headers={"Authorization": "Bearer sk-wrong"}).status_code == 401
        assert "inference_workers" in scrape(live, live.headers)
    finally:
        live.stop()


def test_metrics_from_loopback_need_no_key_by_default(server):
    assert "inference_http_requests_total" in scrape(server)
