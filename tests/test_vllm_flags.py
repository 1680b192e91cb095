"""A vLLM user's command line starts `serve` unchanged and means what it means to vLLM (issue 49)."""
from __future__ import annotations

import secrets
import subprocess
import sys

import httpx
import openai
import pytest

from tests.conftest import TINY_MODEL
from tests.live_server import ROOT, LiveServer, base_env

ORIGIN = "http://webui.example"


@pytest.fixture(scope="module")
def vllm_server(hf_cache, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("vllm-flags")
    key = "sk-vllm-" + secrets.token_hex(16)
    live = LiveServer(base_env(hf_cache, work_dir), work_dir, name="vllm", extra_args=(
        TINY_MODEL, "--api-key", key, "--served-model-name", "tiny", "--max-model-len", "64", "--seed", "7",
        "--allowed-origins", f'["{ORIGIN}"]', "--max-num-seqs", "4", "--revision", "main",
        "--tokenizer", TINY_MODEL, "--generation-config", "vllm", "--tool-call-parser", "hermes",
        "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--no-enable-prefix-caching",
        "--max-num-batched-tokens", "32", "--gpu-memory-utilization", "0.95"))
    live.key = key
    yield live
    live.stop()


def sdk(server: LiveServer, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key or server.key, max_retries=0, timeout=120)


def test_api_key_is_the_key_and_no_other(vllm_server):
    assert sdk(vllm_server).models.list().data
    with pytest.raises(openai.AuthenticationError):
        sdk(vllm_server, "sk-vllm-" + secrets.token_hex(16)).models.list()


def test_served_model_name_is_a_name_clients_may_send(vllm_server):
    reply = sdk(vllm_server).completions.create(model="tiny", prompt="Once upon a time", max_tokens=3, temperature=0)
    by_repo = sdk(vllm_server).completions.create(model=TINY_MODEL, prompt="Once upon a time", max_tokens=3,
                                                  temperature=0)
    assert reply.choices[0].text == by_repo.choices[0].text
    assert reply.usage.completion_tokens == 3


def test_max_model_len_caps_the_context(vllm_server):
    listed = httpx.get(f"{vllm_server.base_url}/v1/models", headers=vllm_server.headers).json()["data"]
    assert {m["id"]: m["max_model_len"] for m in listed}[TINY_MODEL] == 64
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(vllm_server).completions.create(model="tiny", prompt="word " * 80, max_tokens=4)
    assert refused.value.code == "context_length_exceeded"
    fits = sdk(vllm_server).completions.create(model="tiny", prompt="word " * 20, max_tokens=4)
    assert fits.usage.prompt_tokens <= 60


def test_allowed_origins_answers_that_origins_preflight_only(vllm_server):
    def preflight(origin: str) -> httpx.Response:
        return httpx.options(f"{vllm_server.base_url}/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})

    assert preflight(ORIGIN).headers.get("access-control-allow-origin") == ORIGIN
    assert "access-control-allow-origin" not in preflight("http://elsewhere.example").headers


def test_no_enable_prefix_caching_turns_the_prefix_cache_off(vllm_server):
    """The same prompt twice: nothing of the second comes from a cache (with it on, most would)."""
    prompt = "word " * 20
    for _ in range(2):
        reply = sdk(vllm_server).completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
        assert reply.usage.prompt_tokens_details.cached_tokens == 0 and reply.usage.prompt_tokens >= 18


def test_gpu_memory_utilization_sizes_the_kv_cache_budget(vllm_server):
    """No --kv-cache-memory given: the model's budget is what 95 % of the machine's memory leaves, and says so."""
    sdk(vllm_server).completions.create(model="tiny", prompt="Once upon a time", max_tokens=1)
    vllm_server.wait_for_log("KV cache budget")
    line = next(line for line in vllm_server.log().splitlines() if "KV cache budget" in line)
    assert "(the server's --gpu-memory-utilization 0.95)" in line, line


def test_the_engine_flags_become_the_engines_settings():
    from inference_site.inference_settings import InferenceSettings
    from workers.management.vllm_flags import engine_flag_changes

    changes = engine_flag_changes({"max_num_batched_tokens": 2048, "enable_prefix_caching": False,
                                   "gpu_memory_utilization": 0.9, "kv_cache_memory": None}, 512 * 2**20)
    engine = InferenceSettings.from_environ(changes).engine
    assert (engine.prefill_chunk, engine.prefix_cache_bytes, engine.gpu_memory_utilization) == (2048, 0, 0.9)
    assert engine.kv_cache_bytes is None  # a flag not given changes nothing
    on_again = engine_flag_changes({"enable_prefix_caching": True}, 0)  # the environment had it off
    assert InferenceSettings.from_environ({"INFERENCE_PREFIX_CACHE_MB": "0", **on_again}).engine.prefix_cache_bytes > 0
    assert engine_flag_changes({"enable_prefix_caching": True}, 64 * 2**20) == {}  # on already: its size kept


def test_the_flags_are_in_help_and_a_wrong_one_is_refused_before_start():
    helped = subprocess.run([sys.executable, "manage.py", "serve", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120).stdout
    for flag in ("--api-key", "--served-model-name", "--max-model-len", "--seed", "--allowed-origins",
                 "--max-num-seqs", "--revision", "--tokenizer", "--generation-config", "--tool-call-parser",
                 "--reasoning-parser", "--tensor-parallel-size", "--kv-cache-memory-bytes", "--gpu-memory-utilization",
                 "--max-num-batched-tokens", "--enable-prefix-caching", "--no-enable-prefix-caching"):
        assert flag in helped, flag
    refused = subprocess.run([sys.executable, "manage.py", "serve", "--tool-call-parser", "hermes"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "pinned model" in refused.stderr
    worker_help = subprocess.run([sys.executable, "manage.py", "run_worker", "--help"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=120).stdout
    for flag in ("--max-model-len", "--seed", "--max-num-seqs", "--generation-config", "--tensor-parallel-size",
                 "--kv-cache-memory", "--gpu-memory-utilization"):
        assert flag in worker_help, flag
    for flag, wrong, said in (("--tensor-parallel-size", "0", "is not a whole number of at least 1"),
                              ("--tensor-parallel-size", "two", "is not a whole number of at least 1"),
                              ("--gpu-memory-utilization", "1.5", "is not a share of the device's memory"),
                              ("--gpu-memory-utilization", "most", "is not a share of the device's memory")):
        refused = subprocess.run([sys.executable, "manage.py", "run_worker", flag, wrong], cwd=ROOT,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and said in refused.stderr, (flag, wrong)


def test_version_is_this_projects():
    from protocol.version import __version__

    for command in ("serve", "run_worker", "client"):
        printed = subprocess.run([sys.executable, "manage.py", command, "--version"], cwd=ROOT, capture_output=True,
                                 text=True, timeout=120).stdout.strip()
        assert printed.startswith(f"inference-site {__version__} (Django "), (command, printed)
