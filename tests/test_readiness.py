"""/health is readiness (issue 49): once it says ok, the first completion of a fresh process is as quick as
the next (at most 0.5 s more) — the engine and what a first load imports lazily were warmed before. A model
failing every request shows degraded (in /health, /v1/models, /metrics and the admin) within 10 requests."""
from __future__ import annotations

import re

import httpx

from .conftest import TINY_MODEL
from .helpers.admin import admin_client
from .helpers.catalog import listed, wait_until
from .helpers.metrics import scrape, value
from .helpers.readiness import first_and_second
from .live_server import LiveServer, ManagedProcess, base_env

CHANGELIST = "/admin/catalog/cachedmodel/"


def test_serve_pinned_is_ready_when_health_says_ok(hf_cache, tmp_path):
    server = LiveServer(base_env(hf_cache, tmp_path), tmp_path, (TINY_MODEL,), fresh_interpreter=True)  # a cold start
    try:
        server.wait_healthy()
        first, second = first_and_second(server.base_url, server.headers, TINY_MODEL)
        assert first <= second + 0.5, (first, second)
        assert "engine warmed up in" in server.log()
    finally:
        server.stop()


def test_scale_out_worker_is_ready_when_health_says_ok(hf_cache, tmp_path, redis_server):
    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis_server.url, INFERENCE_MODEL=TINY_MODEL)
    web = LiveServer(env, tmp_path, extra_args=("--no-worker", TINY_MODEL), name="web", fresh_interpreter=True)
    worker = ManagedProcess(["manage.py", "run_worker"], env, tmp_path / "worker.log", fresh_interpreter=True)
    try:
        reasons = web.wait_healthy()
        assert any("starting" in reason or "no worker" in reason for reason in reasons)  # not ok before the worker
        first, second = first_and_second(web.base_url, web.headers, TINY_MODEL)
        assert first <= second + 0.5, (first, second)
    finally:
        worker.stop()
        web.stop()


def test_a_model_whose_forward_raises_shows_degraded_within_10_requests(hf_cache, tmp_path):
    """Degraded in /health, /v1/models, /metrics and the admin, with the last error; the admin's reload clears it."""
    server = LiveServer(base_env(hf_cache, tmp_path, INFERENCE_FAILPOINTS="engine.forward=raise"), tmp_path,
                        (TINY_MODEL,))
    try:
        server.wait_healthy()
        statuses = []
        for _ in range(10):
            response = httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=60,
                                  json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 4})
            statuses.append(response.status_code)
            health = httpx.get(f"{server.base_url}/health", timeout=10).json()
            if health["status"] == "degraded":
                break
        assert all(status == 500 for status in statuses), statuses
        record = health["models"][f"{TINY_MODEL}@main"]
        assert record["status"] == "degraded" and record["failed"] == record["of"] == len(statuses)
        assert "engine.forward" in record["last_error"]

        # The catalog heard it when the model turned (not at the next heartbeat): /v1/models and /metrics.
        model = wait_until(lambda: (m := listed(server)[TINY_MODEL])["status"] == "degraded" and m, timeout=2,
                           what="/v1/models to say degraded")  # before a heartbeat (3 s)
        assert model["health"]["failed"] == model["health"]["of"] == len(statuses)
        assert "engine.forward" in model["health"]["last_error"] and len(model["health"]["degraded_on"]) == 1
        assert model["loaded_on"] == model["health"]["degraded_on"]  # still loaded: degraded is not unloaded
        metrics = scrape(server)
        assert value(metrics, "inference_model_degraded") == 1
        assert value(metrics, "inference_model_recent_failures") == value(metrics, "inference_model_recent_requests") \
            == len(statuses)

        # The admin shows it, and reloads it: its record starts afresh everywhere.
        admin = admin_client(server)
        page = admin.get(CHANGELIST).text
        assert "degraded" in page and "engine.forward" in page
        pk = re.search(rf'href="{CHANGELIST}(\d+)/change/[^"]*">{re.escape(TINY_MODEL)}<', page).group(1)
        done = admin.post(CHANGELIST, data={"action": "reload_now", "_selected_action": pk,
                                            "csrfmiddlewaretoken": admin.cookies["csrftoken"]})
        assert f"to reload {TINY_MODEL}" in done.text
        server.wait_for_log(f"unloaded {TINY_MODEL}@main (admin:root)", timeout=30)
        wait_until(lambda: listed(server)[TINY_MODEL]["status"] == "loaded", what="the reloaded model")
        assert listed(server)[TINY_MODEL]["health"] is None
        assert httpx.get(f"{server.base_url}/health", timeout=10).json() == {"status": "ok"}
        assert value(scrape(server), "inference_model_degraded") == 0
        assert "engine.forward" not in admin.get(CHANGELIST).text
    finally:
        server.stop()
