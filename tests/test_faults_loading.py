"""Loads and crashes in the embedded default: a model loading never stalls another model's
streams, an unknown model offline is a 404 at once, and a crash inside generation fails only
that batch's requests while the server goes on serving."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from workers.tiny.builders import build_tiny_model

from .conftest import TINY_MODEL
from .live_server import ROOT, LiveServer, base_env
from .helpers.catalog import manage
from .helpers.processes import Stream

BROKEN = "local/broken"  # its embedding lacks most of its tokenizer's ids
UNKNOWN = "local/no-such-model"
# An address that routes nowhere (TEST-NET-1): the hub is "online" by configuration but unreachable.
UNREACHABLE_HUB = "http://192.0.2.1:9"


@pytest.fixture(scope="module")
def fault_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("fault-cache")
    build_tiny_model(TINY_MODEL, cache_dir=cache)
    build_tiny_model("local/other", cache_dir=cache, seed=1)
    build_tiny_model(BROKEN, cache_dir=cache, vocab_rows=8)
    return cache


@pytest.fixture(scope="module")
def fault_env(fault_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("faults-embedded")
    return base_env(fault_cache, work, HF_HUB_OFFLINE="0", HF_ENDPOINT=UNREACHABLE_HUB), work


@pytest.fixture(scope="module")
def live(fault_env):
    env, work = fault_env
    server = LiveServer(env, work)
    yield server
    server.stop()


def test_unknown_model_offline_is_a_404_at_once_and_leaves_no_row(live, fault_env):
    env, _ = fault_env
    for path, body in (("/v1/completions", {"model": UNKNOWN, "prompt": "hi", "max_tokens": 2}),
                       ("/v1/chat/completions", {"model": UNKNOWN, "messages": [{"role": "user", "content": "hi"}]}),
                       ("/load_model", {"model": UNKNOWN})):
        started = time.monotonic()
        response = httpx.post(live.base_url + path, headers=live.headers, json=body, timeout=30)
        elapsed = time.monotonic() - started
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "model_not_found"
        assert elapsed < 1.0, f"{path}: a 404 for an unknown model took {elapsed:.2f}s"
    rows = manage(env, "shell", "-c", "from catalog.models import CachedModel as M; "
                                      f"print(M.objects.filter(repo_id={UNKNOWN!r}).count())")
    assert rows.strip().splitlines()[-1] == "0"


def test_a_load_does_not_stall_other_streams(live):
    stream = Stream(live, TINY_MODEL, max_tokens=400)
    stream.start()
    stream.wait_for_tokens(5)
    load_times = []
    asked = time.monotonic()
    with httpx.stream("POST", f"{live.base_url}/load_model", headers=live.headers, json={"model": "local/other"},
                      timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                load_times.append((time.monotonic(), json.loads(line[len("data: "):])))
    stream.join(120)
    assert load_times[-1][1]["status"] == "ready" and load_times[-1][1]["cached"] is False
    began, ready = asked, load_times[-1][0]  # from the ask: a quick load may say little before "ready"
    during = [t for t, _ in stream.events if began < t < ready]
    # Tokens kept arriving while the other model loaded (a blocked engine thread sends none; one
    # chunk may still be on its way when the load begins).
    assert len(during) >= 2, f"{len(during)} chunks in the {ready - began:.2f}s the load took"
    assert stream.events[-1][1] == "[DONE]" and '"error"' not in stream.events[-2][1]


def test_a_crash_inside_generation_fails_its_request_alone_and_serving_goes_on(live):
    # Loaded first, so the failing request arrives while the bystander (another model) streams.
    load = httpx.post(f"{live.base_url}/load_model", headers=live.headers, json={"model": BROKEN}, timeout=120)
    assert '"status":"ready"' in load.text
    bystander = Stream(live, TINY_MODEL, max_tokens=400)
    bystander.start()
    bystander.wait_for_tokens(3)
    response = httpx.post(f"{live.base_url}/v1/completions", headers=live.headers, timeout=60,
                          json={"model": BROKEN, "prompt": "Once upon a time", "max_tokens": 4})
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    bystander.join(60)
    assert not bystander.is_alive()
    # The other model's stream goes on to its end: every token, no error event.
    assert bystander.events[-1][1] == "[DONE]"
    assert not any('"error"' in data for _, data in bystander.events)
    assert json.loads(bystander.events[-2][1])["choices"][0]["finish_reason"] == "length"
    for _ in range(2):
        after = httpx.post(f"{live.base_url}/v1/completions", headers=live.headers, timeout=60,
                           json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 4})
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(f"{live.base_url}/health", timeout=10).status_code == 200


class RecordingHub(BaseHTTPRequestHandler):
    """A stand-in hub endpoint that answers 404 to everything and remembers what it was asked."""
    asked: list[str] = []

    def _answer(self) -> None:
        RecordingHub.asked.append(f"{self.command} {self.path}")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _answer

    def log_message(self, *args) -> None:
        pass


def test_cached_models_of_every_kind_load_without_asking_the_hub(tmp_path):
    """Online by configuration (no HF_HUB_OFFLINE): what the cache holds loads from it alone. transformers
    looked for a PEFT adapter_config.json on the hub, which with no network is 23 s of retries."""
    from workers.tiny.encoder import build_tiny_encoder
    from workers.tiny.multimodal import build_tiny_vlm, build_tiny_whisper

    models = {TINY_MODEL: ("causal", build_tiny_model), "local/tiny-vlm": ("image_text", build_tiny_vlm),
              "local/tiny-whisper": ("speech", build_tiny_whisper),
              "local/tiny-encoder": ("embedding", build_tiny_encoder)}
    for name, (_, build) in models.items():
        build(name, cache_dir=tmp_path)
    hub = ThreadingHTTPServer(("127.0.0.1", 0), RecordingHub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    RecordingHub.asked = []
    env = {key: value for key, value in os.environ.items() if key != "HF_HUB_OFFLINE"}
    env.update(HF_HUB_CACHE=str(tmp_path), HF_ENDPOINT=f"http://127.0.0.1:{hub.server_port}")
    code = ("import sys\n"
            "from protocol import ModelRef\n"
            "from workers.engine.models.model_loader import load_model\n"
            "print(*(load_model(ModelRef.parse(name)).kind for name in sys.argv[1:]))\n")
    try:
        result = subprocess.run([sys.executable, "-c", code, *models], env=env, cwd=ROOT, capture_output=True,
                                text=True, timeout=300)
    finally:
        hub.shutdown()
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-len(models):] == [kind for kind, _ in models.values()]
    # (huggingface_hub may fetch its agent-harness registry on its own; nothing may ask for a model)
    assert [asked for asked in RecordingHub.asked if any(name in asked for name in models)] == []
