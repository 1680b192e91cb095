"""The options of the seeds' servers and clients (issue 39), through real servers, the real SDK, tiny models.

Two servers, started once for this package and shared by every test in it:
- `keyed`: auth on with the operator's own key (`--auth-token-file`), pins a model whose repo carries its own code (`serve MODEL --trust-remote-code`), every
  model's attention `eager` (`--attn-implementation`), CORS for any origin (`--enable-cors`), and per-model
  settings from a config file (quantize one on load with torchao, ask bitsandbytes of another on this CPU).
- `open`: auth off, pins a local model folder of a training run with its latest checkpoint's weights
  (forgather's `-c`), quantizes every model on load (`--quantization`), and sets forgather's server-wide request
  defaults (`--default-seed`, `--stop-sequences`, `--ignore-eos`), a dtype alias and the log level.
"""
from __future__ import annotations

import os
import shutil

import pytest

from workers.tiny.builders import CHAT_TEMPLATE_PATH, build_tiny_model
from workers.tiny.variants import build_tiny_bf16_model, build_tiny_quantized_model, build_tiny_remote_code_model

from ..conftest import TINY_MODEL, Reference, snapshot_of
from ..helpers.seed_options import BF16, BNB, FIRST_RUN, ONLOAD_INT8, REMOTE, SAVED_INT8, UNANNOUNCED_INT8, UNTRUSTED
from ..live_server import LiveServer, base_env


@pytest.fixture(scope="package")
def options_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("options-cache")
    for name in (TINY_MODEL, ONLOAD_INT8, BNB):
        build_tiny_model(name, cache_dir=cache)  # seed 0: the same weights under every name
    build_tiny_remote_code_model(REMOTE, cache_dir=cache)
    build_tiny_remote_code_model(UNTRUSTED, cache_dir=cache)
    build_tiny_quantized_model(SAVED_INT8, cache_dir=cache)
    build_tiny_quantized_model(UNANNOUNCED_INT8, cache_dir=cache, with_config=False)
    build_tiny_model(FIRST_RUN, size="tiny-long", cache_dir=cache)
    build_tiny_bf16_model(BF16, cache_dir=cache)
    return cache


@pytest.fixture(scope="package")
def keyed(options_cache, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("keyed")
    config = work_dir / "server.yaml"
    config.write_text(f"models:\n  - name: {ONLOAD_INT8}\n    quantization: torchao-int8\n"
                      f"  - name: {BNB}\n    quantization: bnb-4bit\n"
                      f"  - name: {BF16}\n    dtype: checkpoint\n")
    token = work_dir / "token"
    token.write_text("operator-chosen-key-0123456789\n")
    token.chmod(0o600)
    env = base_env(options_cache, work_dir, INFERENCE_WORKER_ACK_TIMEOUT="60")
    live = LiveServer(env, work_dir, name="keyed",
                      extra_args=(REMOTE, "--trust-remote-code", "--attn-implementation", "eager", "--enable-cors",
                                  "--auth-token-file", str(token), "--config", str(config)))
    assert not live.key_file.exists()  # a given key is never written to the port's key file
    live.key, live.token_file = "operator-chosen-key-0123456789", token  # every test here sends it
    live.env = env  # for teams made by the management commands
    yield live
    live.stop()


@pytest.fixture(scope="package")
def open_server(options_cache, tmp_path_factory):
    """`serve FOLDER -c --no-auth --quantization torchao-int8 …`: a training run's folder outside the cache, pinned
    with its latest checkpoint's weights (forgather's layout: none at the top, an older checkpoint broken)."""
    work_dir = tmp_path_factory.mktemp("open")
    folder = work_dir / "my-model"
    shutil.copytree(snapshot_of(options_cache, TINY_MODEL), folder)  # the snapshot's links, copied as files
    for step in (100, 200):
        (folder / "checkpoints" / f"checkpoint-{step}").mkdir(parents=True)
    (folder / "model.safetensors").rename(folder / "checkpoints" / "checkpoint-200" / "model.safetensors")
    (folder / "checkpoints" / "checkpoint-100" / "model.safetensors").write_bytes(b"not the weights")
    os.utime(folder / "checkpoints" / "checkpoint-100", (1, 1))  # saved long before checkpoint-200
    config = work_dir / "server.yaml"
    config.write_text("from-checkpoint: true\n")  # `-c`, as a config file says it
    template = work_dir / "moods.jinja"  # the tiny template, and first every message's `mood` (an extra field)
    template.write_text("{%- for m in messages %}{%- if m.mood is defined %}{{ '[' + m.mood + ']' }}{%- endif %}"
                        "{%- endfor %}" + CHAT_TEMPLATE_PATH.read_text())
    live = LiveServer(base_env(options_cache, work_dir, INFERENCE_WORKER_ACK_TIMEOUT="60"), work_dir, name="open",
                      extra_args=(str(folder), "--config", str(config), "--no-auth", "--quantization", "torchao-int8", "--default-seed", "7",
                                  "--stop-sequences", "a", "--ignore-eos", "--dtype", "fp32", "--log-level", "debug",
                                  "--pass-message-extras", "--chat-template", str(template)))
    yield live
    live.stop()


@pytest.fixture(scope="package")
def reference(options_cache) -> Reference:
    return Reference(options_cache)
