"""The seeds' options: quantization."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from transformers import AutoModelForCausalLM

from ..conftest import FROM_CACHE, TINY_MODEL, snapshot_of
from ..helpers.seed_options import BF16, BNB, ONLOAD_INT8, SAVED_INT8, UNANNOUNCED_INT8, complete, greedy_text, wait_loaded
from ..live_server import ROOT, base_env


def test_a_checkpoint_saved_quantized_loads_quantized(keyed, options_cache, reference):
    response = complete(keyed, model=SAVED_INT8)
    assert response.status_code == 200, response.text
    saved = AutoModelForCausalLM.from_pretrained(SAVED_INT8, cache_dir=options_cache, **FROM_CACHE).eval()
    assert response.json()["choices"][0]["text"] == greedy_text(saved, reference, 8)
    assert "quantized torchao" in keyed.log()
    refused = complete(keyed, model=UNANNOUNCED_INT8)  # transformers alone would load random weights in their place
    assert refused.status_code == 503, refused.text
    assert "saved quantized by torchao (Int8Tensor)" in refused.json()["error"]["message"]


def test_quantized_on_load_holds_less_memory_than_the_same_model_unquantized(keyed, options_cache, reference):
    for name in (TINY_MODEL, ONLOAD_INT8):
        assert complete(keyed, model=name).status_code == 200
    plain, quantized = wait_loaded(keyed, TINY_MODEL), wait_loaded(keyed, ONLOAD_INT8)
    assert quantized["memory_bytes"] < 0.8 * plain["memory_bytes"], (quantized, plain)
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    expected = AutoModelForCausalLM.from_pretrained(
        ONLOAD_INT8, cache_dir=options_cache, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()),
        **FROM_CACHE).eval()
    assert complete(keyed, model=ONLOAD_INT8).json()["choices"][0]["text"] == greedy_text(expected, reference, 8)


def test_dtype_checkpoint_loads_a_model_as_it_was_saved(keyed):
    """`auto` (the default) is the device's dtype, fp32 on CPU; `checkpoint` is the saved one (bf16 here)."""
    for name in (TINY_MODEL, BF16):
        assert complete(keyed, model=name).status_code == 200
    half, full = wait_loaded(keyed, BF16)["memory_bytes"], wait_loaded(keyed, TINY_MODEL)["memory_bytes"]
    assert abs(2 * half - full) < 0.01 * full, (half, full)
    assert f"loaded {BF16}@main on cpu as torch.bfloat16" in keyed.log()


def test_bitsandbytes_on_a_cpu_worker_is_refused_saying_why(keyed):
    response = complete(keyed, model=BNB)
    assert response.status_code == 503, response.text
    message = response.json()["error"]["message"]
    assert "needs a CUDA GPU" in message and "torchao-int8" in message


def test_serve_refuses_unknown_options_saying_why(options_cache, tmp_path):
    env = base_env(options_cache, tmp_path)
    weightless = tmp_path / "run"  # a training run's folder before its first checkpoint
    weightless.mkdir()
    shutil.copy(snapshot_of(options_cache, TINY_MODEL) / "config.json", weightless)
    for flags, said in ((("--attn-implementation", "warp_speed"), "unknown attn_implementation"),
                        (("--trust-remote-code",), "applies to the pinned model"),
                        ((TINY_MODEL, "--from-checkpoint"), "serves a local model folder's checkpoint"),
                        ((str(weightless), "-c"), "holds no training checkpoint")):
        done = subprocess.run([sys.executable, "manage.py", "serve", "--port", "1", *flags], env=env,
                              cwd=str(ROOT), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode != 0 and said in done.stderr, done.stderr


def run_client(server, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "INFERENCE_API_KEY")}
    env.update(DJANGO_SETTINGS_MODULE="inference_site.settings", INFERENCE_VAR_DIR=str(server.work_dir / "client-var"),
               INFERENCE_KEY_DIR=str(server.work_dir / "no-keys"), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "manage.py", "client", "--url", f"{server.base_url}/v1", *args],
                          input=stdin, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_the_operators_key_from_a_file_on_server_and_client(keyed):
    done = run_client(keyed, "--auth-token-file", str(keyed.token_file), "--interactive", "--max-tokens", "3",
                      stdin="Hello\nq\nnever sent\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("> ") == 2  # one turn, then `q` quit (forgather's) before the third line
    refused = run_client(keyed, "--auth-token", "not-the-key-at-all", "--list-models")
    assert refused.returncode != 0, refused.stdout
