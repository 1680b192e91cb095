"""The options of the seeds' servers and clients (issue 39), through real servers, the real SDK, tiny models.

Two servers, shared by every test here:
- `keyed`: auth on with the operator's own key (`--auth-token-file`), pins a model whose repo carries its own code (`serve MODEL --trust-remote-code`), every
  model's attention `eager` (`--attn-implementation`), CORS for any origin (`--enable-cors`), and per-model
  settings from a config file (quantize one on load with torchao, ask bitsandbytes of another on this CPU).
- `open`: auth off, pins a local model folder of a training run with its latest checkpoint's weights
  (forgather's `-c`), quantizes every model on load (`--quantization`), and sets forgather's server-wide request
  defaults (`--default-seed`, `--stop-sequences`, `--ignore-eos`), a dtype alias and the log level.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import httpx
import pytest
import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM

from workers.tiny.builders import CHAT_TEMPLATE_PATH, build_tiny_model
from workers.tiny.variants import build_tiny_bf16_model, build_tiny_quantized_model, build_tiny_remote_code_model

from .conftest import FROM_CACHE, TINY_MODEL, Reference, snapshot_of
from .live_server import ROOT, LiveServer, base_env
from .teams_setup import make_teams

REMOTE = "local/tiny-remote"  # pinned, its own code trusted by the flag
UNTRUSTED = "local/tiny-remote-untrusted"  # the same repo, never trusted
SAVED_INT8 = "local/tiny-llama-int8"  # saved quantized by torchao (quantization_config in config.json)
UNANNOUNCED_INT8 = "local/tiny-llama-int8-no-config"  # the same weights, config.json without quantization_config
ONLOAD_INT8 = "local/tiny-llama-onload-int8"  # quantized on load (its config-file entry)
BNB = "local/tiny-llama-bnb"  # bitsandbytes asked on a CPU worker
BF16 = "local/tiny-llama-bf16"  # saved in bfloat16, loaded as saved (dtype: checkpoint)
FIRST_RUN = "local/tiny-long"  # what `serve` builds on a first run (create_tiny_model --size tiny-long)
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def reference(options_cache) -> Reference:
    return Reference(options_cache)


def sdk(server) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)


def listed(server) -> dict[str, dict]:
    body = httpx.get(f"{server.base_url}/v1/models", headers=server.headers, timeout=30).json()
    return {model["id"]: model for model in body["data"]}


def wait_loaded(server, name: str, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = listed(server).get(name, {})
        if model.get("status") == "loaded":
            return model
        time.sleep(0.3)
    raise AssertionError(f"{name} not loaded: {listed(server).get(name)}")


def greedy_text(model: torch.nn.Module, reference: Reference, tokens: int) -> str:
    prompt = reference.encode(PROMPT)
    with torch.no_grad():
        output = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                max_new_tokens=tokens, do_sample=False, pad_token_id=reference.tokenizer.pad_token_id)
    return reference.decode(output[0, len(prompt):].tolist())


def complete(server, tokens: int = 8, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=120,
                      json={"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, **body})


# --- the pinned model, its own code, the attention choice -------------------------------------------------

def test_pinned_model_is_preloaded_and_requests_may_leave_model_out(keyed, reference):
    model = wait_loaded(keyed, REMOTE)  # preloaded at start, nobody asked
    assert model["memory_bytes"] > 0
    response = complete(keyed)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == REMOTE
    # Its own code is Llama's, attention eager here: the tiny Llama's greedy text, token for token.
    assert body["choices"][0]["text"] == reference.decode(reference.greedy(reference.encode(PROMPT), 8))
    assert "with trust_remote_code" in keyed.log() and "attention eager" in keyed.log()


def test_a_repo_with_its_own_code_is_refused_unless_trusted(keyed):
    response = complete(keyed, model=UNTRUSTED)
    assert response.status_code == 503, response.text
    message = response.json()["error"]["message"]
    assert "trust_remote_code" in message and "its own Python code" in message


# --- quantization -------------------------------------------------------------------------------------------

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


# --- a local folder, pinned, quantized server-wide ----------------------------------------------------------

def test_a_local_folder_is_served_pinned_and_quantized(open_server, reference):
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
    assert chat.choices[0].message is not None
    # The default (issue 49): the custom role still reaches the template, the unknown field is ignored.
    default = httpx.post(f"{keyed.base_url}/tokenize", headers=keyed.headers, timeout=60,
                         json={"messages": messages, "return_token_strs": True})
    assert default.status_code == 200, default.text
    default_render = "".join(default.json()["token_strs"])
    assert "<|im_start|>my-custom-role" in default_render and "cheerful" not in default_render, default_render


# --- generation_config, do_sample, max_new_tokens ----------------------------------------------------------

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


def test_do_sample_and_max_new_tokens_as_fields(keyed, reference):
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


# --- CORS ---------------------------------------------------------------------------------------------------

def test_cors_preflight_needs_no_key_and_answers_carry_the_headers(keyed):
    origin = "http://localhost:3000"
    preflight = httpx.options(f"{keyed.base_url}/v1/chat/completions", timeout=30, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    models = httpx.get(f"{keyed.base_url}/v1/models", headers={**keyed.headers, "Origin": origin}, timeout=30)
    assert models.status_code == 200 and models.headers["access-control-allow-origin"] == "*"
    assert "x-request-id" in models.headers["access-control-expose-headers"]
    refused = httpx.get(f"{keyed.base_url}/v1/models", headers={"Origin": origin}, timeout=30)
    assert refused.status_code == 401  # CORS lets a page call; the key is still needed


def test_cors_is_off_unless_asked(open_server):
    preflight = httpx.options(f"{open_server.base_url}/v1/models", timeout=30, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in preflight.headers


# --- transformers chat, the seeds' own client, unchanged --------------------------------------------------

def transformers_chat(server, model: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The installed transformers' `chat` CLI: two turns typed on stdin, greedy via its generate flags (each
    answer that stops at max_new_tokens asks whether to go on: "n"; spare "!exit"s if one was not asked)."""
    cli = shutil.which("transformers", path=os.path.dirname(sys.executable)) or "transformers"
    return subprocess.run([cli, "chat", model, server.base_url, "max_new_tokens=6", "do_sample=False"],
                          input="Hello there\nn\nAnd again\nn\n!exit\n!exit\n!exit\n", capture_output=True, text=True, timeout=180,
                          env={**{k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"},  # its client refuses
                               "COLUMNS": "200", "TERM": "dumb", **env})                      # even a local URL offline


def chat_requests(server) -> int:
    return server.log().count("/v1/chat/completions")


@pytest.mark.parametrize("which", ["keyed", "open_server"])
def test_transformers_chat_works_unchanged(which, request):
    """With auth on it sends its key (HF_TOKEN) to the API; its /load_model carries none, and is answered
    for the pinned model, which is loaded."""
    server = request.getfixturevalue(which)
    model = REMOTE if which == "keyed" else "local/my-model"
    wait_loaded(server, model)
    before = chat_requests(server)
    done = transformers_chat(server, model, {"HF_TOKEN": server.key} if which == "keyed" else {})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{model} was already loaded" in done.stdout
    assert f"<{model}>" in done.stdout  # its answers' heading, once per turn
    # Two turns; an answer that ended on a stop (the open server's --stop-sequences) rather than the length asks
    # no question, and its "n" goes as one more turn.
    assert 2 <= chat_requests(server) - before <= 4, server.log()[-3000:]


def load_model(server, body: dict, key: str | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}/load_model", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}"} if key else {})


def test_load_model_tells_a_caller_without_the_right_no_more_than_a_named_loaded_models_readiness(keyed):
    """The deliberate exception (docs/teams.md): `ready` for a loaded model asked by name, nothing else; a model
    some team may not use is not told of without a key, nor to a key of a team that may not use it."""
    assert complete(keyed, model=TINY_MODEL).status_code == 200  # loaded now, beside the pinned model
    ready = load_model(keyed, {"model": REMOTE})
    assert ready.status_code == 200 and json.loads(ready.text.split("data: ", 1)[1]) == {
        "status": "ready", "model": REMOTE, "cached": True}
    for body in ({"model": BNB}, {}, {"model": REMOTE, "stream": True}, {"model": "local/" + "x" * 400}):
        assert load_model(keyed, body).status_code == 401, body  # not loaded; the pinned model unnamed; more asked
    secrets = make_teams(keyed.env, teams={"narrow": ["--models", REMOTE]}, keys={"narrow": ["--team", "narrow"]})
    assert load_model(keyed, {"model": TINY_MODEL}).status_code == 401  # loaded, but not every team's
    assert load_model(keyed, {"model": REMOTE}).status_code == 200  # still every team's
    refused = load_model(keyed, {"model": TINY_MODEL}, key=secrets["narrow"])
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"  # as if unknown
    assert load_model(keyed, {"model": REMOTE}, key=secrets["narrow"]).status_code == 200


# --- Open WebUI: context errors in the request's terms, one reading of a model's context ---------------------

LONG = " ".join(["word"] * 700)  # past the tiny models' 512 tokens


def test_context_errors_say_what_fits_and_name_the_endpoints_fields(keyed):
    def post(path: str, body: dict) -> dict:
        response = httpx.post(f"{keyed.base_url}{path}", headers=keyed.headers, json=body, timeout=60)
        assert response.status_code == 400, response.text
        return response.json()["error"]

    error = post("/v1/chat/completions", {"messages": [{"role": "system", "content": LONG},
                                                       {"role": "user", "content": "Hi"}]})
    assert error["param"] == "messages" and error["code"] == "context_length_exceeded"
    assert "shorten the `messages` to at most 511 tokens" in error["message"], error["message"]
    error = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                          "max_completion_tokens": 100000})
    assert error["param"] == "max_completion_tokens"
    assert "set `max_completion_tokens` to at most" in error["message"] and "`prompt`" not in error["message"]
    error = post("/v1/responses", {"input": LONG, "max_output_tokens": 16})
    assert error["param"] == "input" and "shorten the `input` to at most 496 tokens" in error["message"]


def open_webui_tools(count: int = 36) -> list[dict]:
    """Tool definitions shaped as Open WebUI's, as many as it sends with every message."""
    words = "search the notes of the user for a term and give back the matching lines with their dates".split()
    return [{"type": "function", "function": {
        "name": f"tool_{index}", "description": " ".join(words * 3),
        "parameters": {"type": "object", "required": ["query"], "properties": {
            name: {"type": "string", "description": " ".join(words)} for name in ("query", "folder", "since", "kind")}}}}
        for index in range(count)]


def test_the_first_run_model_holds_open_webuis_tool_list(keyed):
    """A chat with a third of Open WebUI's 36 tool definitions (~5k tokens here: its whole list, ~15k, took 13 s
    to prefill on 2 busy cores) fits the model serve builds on a first run, 10x the 512 tokens it had; without
    max_tokens its generation_config.json's max_new_tokens (512) ends an answer."""
    model = next(m for m in listed(keyed).values() if m["id"] == FIRST_RUN)
    assert model["max_model_len"] == 32768
    client = sdk(keyed)
    result = client.chat.completions.create(model=FIRST_RUN, tools=open_webui_tools(12), max_tokens=2,
                                            messages=[{"role": "user", "content": "Hello"}])
    assert result.usage.prompt_tokens > 4000, result.usage
    endless = client.chat.completions.create(model=FIRST_RUN, messages=[{"role": "user", "content": "Hello"}],
                                             extra_body={"ignore_eos": True})
    assert endless.usage.completion_tokens == 512 and endless.choices[0].finish_reason == "length"


def test_one_reading_of_a_models_context():
    from protocol.context_length import context_length

    vision = {"vision_config": {"image_size": 32}, "text_config": {"max_position_embeddings": 32768}}
    assert context_length(vision, 512) == 32768  # the text model's, not the tokenizer's
    assert context_length({"max_position_embeddings": 4096, "text_config": {"max_position_embeddings": 8}}) == 4096
    assert context_length({}, 1024) == 1024 and context_length({}, 10**30) == 2048


def test_omni_models_take_images_video_and_audio():
    """Gemma 3n/4 (vision and audio encoders beside the text model) and Qwen2.5-Omni (the same in its
    thinker_config) are classed as taking audio too, not image-only."""
    from protocol.modalities import input_modalities, model_kind

    gemma = {"architectures": ["Gemma4ForConditionalGeneration"], "text_config": {}, "vision_config": {},
             "audio_config": {}}
    qwen_omni = {"architectures": ["Qwen2_5OmniForConditionalGeneration"], "talker_config": {},
                 "thinker_config": {"text_config": {}, "vision_config": {}, "audio_config": {}}}
    for config in (gemma, qwen_omni):
        assert model_kind(config) == "omni"
        assert set(input_modalities(model_kind(config))) == {"text", "image", "video", "audio"}
    assert model_kind({"text_config": {}, "vision_config": {}}) == "image_text"


def test_download_progress_reports_bytes_as_they_arrive():
    """/load_model's `download` stage: the bytes huggingface_hub's snapshot_download writes, through its own
    progress-bar factory (no hub here to download from)."""
    from huggingface_hub.utils.tqdm import _create_progress_bar

    from workers.engine.models import model_loader

    events = []
    bar_class = model_loader.bytes_progress(lambda stage, value=None: events.append((stage, value)))
    files = _create_progress_bar(cls=bar_class, log_level=20, name="huggingface_hub.snapshot_download.transfer",
                                 total=0, unit="B")
    written = _create_progress_bar(cls=bar_class, log_level=20, name="huggingface_hub.snapshot_download",
                                   total=0, unit="B")
    written.total = 3000
    for _ in range(3):
        files.update(1000)  # the network side's bar says nothing: the bytes on disk are what counts
        written.update(1000)
        time.sleep(model_loader.DOWNLOAD_EVENT_SECONDS)
    assert events == [("download", {"current": n, "total": 3000}) for n in (1000, 2000, 3000)]
