"""GGUF files served as llama.cpp users have them: `serve FILE.gguf`, a repo of `.gguf` files, `repo:FILE`.

The tiny Llama is written as GGUF files in the test with the `gguf` package (workers/tiny/gguf_files.py: F32
and F16, llama.cpp's tensor names and Q/K layout, the vocabulary and chat template in the header). Through
one real server (pinned to a lone `.gguf` file, a config file choosing a repo's F16 file): the F32 file
gives the greedy tokens of the same weights from safetensors (alone, batched, in one request, and a chat
answer), the F16 file those of transformers' own load of that file, and loads into the dtype its settings
choose; /v1/models lists the files with their quantization types; a GGUF of an architecture transformers
cannot read is refused with its reason (an OpenAI-shaped 503, logged, the catalog showing the error); an
unknown file is a 404. Without a server: `serve FILE.gguf` / `FOLDER:QUANT` linking, the admin's file choice,
and the real SmolLM2 built from the pip package's GGUF holding that file's weights exactly.
"""
from __future__ import annotations

import asyncio
import functools
import random
import shutil

import httpx
import pytest
import torch
from openai import AsyncOpenAI
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from workers.tiny.builders import build_tiny_model
from workers.tiny.gguf_files import build_tiny_gguf_model

from .conftest import Reference
from .live_server import LiveServer, base_env, clients

SAFETENSORS = "local/tiny-llama"
GGUF_REPO = "local/tiny-llama-gguf"  # F16 and F32 files
UNREADABLE = "local/tiny-rwkv-gguf"  # the same tensors under llama.cpp's `rwkv6`: transformers reads no such GGUF
PINNED = "local/tiny-llama.F32"  # `serve tiny-llama.F32.gguf`
TOKENS = 12
RANDOM = random.Random(7)
PROMPTS = [[1, *(RANDOM.randrange(10, 1000) for _ in range(n))] for n in (3, 17, 60)]


@pytest.fixture(scope="module")
def gguf_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("gguf-cache")
    source = build_tiny_model(SAFETENSORS, cache_dir=cache)
    snapshot = build_tiny_gguf_model(GGUF_REPO, source, cache_dir=cache, types=("F32", "F16"))
    build_tiny_gguf_model(UNREADABLE, source, cache_dir=cache, architecture="rwkv6")
    lone = tmp_path_factory.mktemp("gguf-file") / "tiny-llama.F32.gguf"
    shutil.copy(snapshot / "tiny-llama-gguf.F32.gguf", lone)
    return cache, lone


@pytest.fixture(scope="module")
def gguf_server(gguf_cache, tmp_path_factory):
    cache, lone = gguf_cache
    work = tmp_path_factory.mktemp("gguf-server")
    (work / "server.yaml").write_text(f"models:\n  - name: {GGUF_REPO}\n    gguf-file: f16\n"
                                      f"  - name: {GGUF_REPO}:F16\n    dtype: bfloat16\n")
    live = LiveServer(base_env(cache, work, INFERENCE_PREFILL_CHUNK="24"), work,
                      (str(lone), "--config", str(work / "server.yaml")), name="gguf")
    yield live
    live.stop()


@functools.cache
def gguf_reference(cache, file: str) -> Reference:
    """transformers' own load of one GGUF file of the repo (the tokenizer from the file too)."""
    snapshot = next((cache / f"models--{GGUF_REPO.replace('/', '--')}" / "snapshots").iterdir())
    reference = Reference.__new__(Reference)
    reference.tokenizer = AutoTokenizer.from_pretrained(snapshot, gguf_file=file)
    reference.model = AutoModelForCausalLM.from_pretrained(snapshot, gguf_file=file, dtype=torch.float32).eval()
    return reference


async def complete(client: AsyncOpenAI, model: str, prompt, tokens: int = TOKENS) -> list[list[int]]:
    response = await client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0,
                                               extra_body={"ignore_eos": True, "return_token_ids": True})
    return [choice.model_extra.get("token_ids") or [] for choice in sorted(response.choices, key=lambda c: c.index)]


def test_a_gguf_file_serves_the_greedy_tokens_of_the_same_weights_from_safetensors(gguf_cache, gguf_server):
    cache, _ = gguf_cache
    safetensors = Reference(cache, SAFETENSORS)
    expected = [safetensors.greedy(prompt, TOKENS, min_new_tokens=TOKENS) for prompt in PROMPTS]
    _, client = clients(gguf_server)

    async def run():
        pinned = await asyncio.gather(*[complete(client, PINNED, [prompt]) for prompt in PROMPTS])
        by_tag = await complete(client, f"{GGUF_REPO}:F32", PROMPTS)  # `repo:QUANT`, as llama.cpp's -hf
        by_file = await complete(client, f"{GGUF_REPO}:tiny-llama-gguf.F32.gguf", [PROMPTS[1]])
        return pinned, by_tag, by_file

    pinned, by_tag, by_file = asyncio.run(run())
    assert [tokens for [tokens] in pinned] == expected, "the pinned .gguf file, prompts at once"
    assert by_tag == expected, "repo:F32, three prompts in one request"
    assert by_file == [expected[1]], "repo:FILE"
    # the chat template and special tokens come from the file's header
    sync, _ = clients(gguf_server)
    messages = [{"role": "user", "content": "Once upon a time"}]
    prompt = safetensors.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"]
    answer = sync.chat.completions.create(model=PINNED, messages=messages, max_tokens=TOKENS, temperature=0)
    assert answer.choices[0].message.content == safetensors.decode(safetensors.greedy(prompt, TOKENS))
    assert answer.usage.prompt_tokens == len(prompt)


def test_the_repo_serves_the_file_its_settings_choose(gguf_cache, gguf_server):
    """The config file chose the F16 file for the plain repo name; its tokens are transformers' load of that file."""
    cache, _ = gguf_cache
    reference = gguf_reference(cache, "tiny-llama-gguf.F16.gguf")
    expected = [reference.greedy(prompt, TOKENS, min_new_tokens=TOKENS) for prompt in PROMPTS]
    _, client = clients(gguf_server)
    assert asyncio.run(complete(client, GGUF_REPO, PROMPTS)) == expected
    assert "loaded the GGUF file tiny-llama-gguf.F16.gguf (F16) of local/tiny-llama-gguf@main on cpu as torch.float32" \
        in gguf_server.log()


def test_a_gguf_file_loads_into_the_dtype_its_settings_choose(gguf_server):
    """Dequantized into the catalog's dtype: the F16 file as bfloat16 holds half the pinned float32 file's bytes."""
    sync, _ = clients(gguf_server)
    name = f"{GGUF_REPO}:tiny-llama-gguf.F16.gguf"
    for model in (name, PINNED):
        assert sync.completions.create(model=model, prompt="Once upon a time", max_tokens=4).choices[0].text
    cards = {card.id: card.model_extra for card in sync.models.list().data}
    # (the rotary tables stay float32: a few bytes over half)
    assert 0.5 <= cards[name]["memory_bytes"] / cards[PINNED]["memory_bytes"] < 0.51
    assert f"of {name}@main on cpu as torch.bfloat16" in gguf_server.log()


def test_the_catalog_lists_gguf_files_with_their_quantization_type(gguf_server):
    sync, _ = clients(gguf_server)
    cards = {card.id: card.model_extra for card in sync.models.list().data}
    assert cards[GGUF_REPO]["gguf_files"] == [{"file": "tiny-llama-gguf.F16.gguf", "quantization": "F16"},
                                              {"file": "tiny-llama-gguf.F32.gguf", "quantization": "F32"}]
    for kind in ("F16", "F32"):
        card = cards[f"{GGUF_REPO}:tiny-llama-gguf.{kind}.gguf"]
        assert card["gguf_files"] == [{"file": f"tiny-llama-gguf.{kind}.gguf", "quantization": kind}]
        assert card["max_model_len"] == 512 and card["tasks"] == ["generate"]
    assert cards[PINNED]["gguf_files"] == [{"file": "tiny-llama.F32.gguf", "quantization": "F32"}]
    # the parsers its answers get, from the chat template in its header: those of the same template in files
    assert cards[GGUF_REPO]["parsers"] == cards[SAFETENSORS]["parsers"] and cards[GGUF_REPO]["parsers"]["tool_parser"]


def test_a_gguf_architecture_transformers_cannot_read_is_refused_with_its_reason(gguf_server):
    response = httpx.post(f"{gguf_server.base_url}/v1/completions", headers=gguf_server.headers, timeout=60,
                          json={"model": UNREADABLE, "prompt": "Once", "max_tokens": 2})
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "model_load_failed" and error["param"] == "model"
    assert "architecture `rwkv6`" in error["message"] and "cannot be loaded by transformers" in error["message"]
    assert "architecture `rwkv6`" in gguf_server.log()
    sync, _ = clients(gguf_server)
    card = next(card.model_extra for card in sync.models.list().data if card.id == UNREADABLE)
    assert card["status"] == "error"


def test_a_file_the_repo_lacks_is_a_404(gguf_server):
    response = httpx.post(f"{gguf_server.base_url}/v1/completions", headers=gguf_server.headers, timeout=60,
                          json={"model": f"{GGUF_REPO}:Q8_0", "prompt": "Once", "max_tokens": 2})
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "model_not_found"


LLAMA_CPP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "attn_norm": "input_layernorm",
                   "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                   "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
                   "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def llama_cpp_permuted(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """The row order llama.cpp's converter gives q and k (rotary halves interleaved per head)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def test_the_real_smollm2_dequantized_holds_the_gguf_file_s_weights(tmp_path):
    """workers/tiny/smollm2.py: the checkpoint other benchmarks load is the Q4_1 file's weights, exactly — every
    tensor of the file dequantized by the gguf package itself (not by transformers' loader, which built it)."""
    import gguf
    from safetensors.torch import load_file

    from workers.tiny.smollm2 import build_smollm2, smollm2_gguf_path

    model_id = build_smollm2(tmp_path)
    assert build_smollm2(tmp_path) == model_id == "local/SmolLM2-135M-Instruct"  # kept, not rebuilt
    snapshot = next((tmp_path / "models--local--SmolLM2-135M-Instruct" / "snapshots").iterdir())
    saved = {name: tensor for file in snapshot.glob("*.safetensors") for name, tensor in load_file(file).items()}
    config = AutoConfig.from_pretrained(model_id, cache_dir=tmp_path, local_files_only=True)
    compared = 0
    for tensor in gguf.GGUFReader(smollm2_gguf_path()).tensors:
        parts = tensor.name.split(".")  # blk.N.attn_q.weight / token_embd.weight
        name = (f"model.layers.{parts[1]}.{LLAMA_CPP_NAMES[parts[2]]}.{parts[3]}" if parts[0] == "blk"
                else f"{LLAMA_CPP_NAMES[parts[0]]}.{parts[1]}")
        expected = saved[name]
        if parts[2:3] == ["attn_q"]:
            expected = llama_cpp_permuted(expected, config.num_attention_heads)
        elif parts[2:3] == ["attn_k"]:
            expected = llama_cpp_permuted(expected, config.num_key_value_heads)
        from_file = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy())
        assert torch.equal(from_file.reshape(expected.shape).to(expected.dtype), expected), name
        compared += 1
    assert compared == len(saved) - ("lm_head.weight" in saved)  # every weight came from the file (lm_head tied)
    tokenizer = AutoTokenizer.from_pretrained(model_id, cache_dir=tmp_path, local_files_only=True)
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"


def test_serve_takes_a_gguf_file_a_folder_of_them_and_folder_colon_file(gguf_cache, tmp_path, monkeypatch):
    """`serve FILE.gguf`, `serve FOLDER` and `serve FOLDER:QUANT` link into the cache as the catalog names them
    (catalog/local_folders.py's `link_gguf`, which `serve` calls)."""
    from huggingface_hub import constants as hf_constants

    from catalog import hf_cache
    from catalog.local_folders import link_gguf

    cache, lone = gguf_cache
    snapshot = next((cache / f"models--{GGUF_REPO.replace('/', '--')}" / "snapshots").iterdir())
    folder = tmp_path / "my-ggufs"
    folder.mkdir()
    for name in ("tiny-llama-gguf.F16.gguf", "tiny-llama-gguf.F32.gguf"):
        shutil.copy(snapshot / name, folder / name)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    hf_cache.forget_scan()
    try:
        assert link_gguf(str(lone)) == "local/tiny-llama.F32"
        assert link_gguf(f"{folder}:f16") == "local/my-ggufs:tiny-llama-gguf.F16.gguf"
        assert link_gguf(str(folder)) == ""  # a plain folder: linked as any model folder (serve's usual path)
        listed = {entry.repo_id: entry for entry in hf_cache.scan_cached_models(tmp_path / "hf")}
        assert sorted(listed) == ["local/my-ggufs", "local/my-ggufs:tiny-llama-gguf.F16.gguf",
                                  "local/my-ggufs:tiny-llama-gguf.F32.gguf", "local/tiny-llama.F32"]
        assert listed["local/my-ggufs"].gguf_files == (("tiny-llama-gguf.F16.gguf", "F16"),
                                                       ("tiny-llama-gguf.F32.gguf", "F32"))
        assert listed["local/my-ggufs"].architectures == ("gguf:llama",) and listed["local/my-ggufs"].is_causal_lm
        with pytest.raises(ValueError, match="holds no GGUF file `Q8_0`"):
            link_gguf(f"{folder}:Q8_0")
    finally:
        hf_cache.forget_scan()


@pytest.mark.django_db
def test_the_admin_shows_a_gguf_repo_s_files_and_chooses_the_one_it_serves(admin_client, gguf_cache, monkeypatch):
    from huggingface_hub import constants as hf_constants

    from catalog import hf_cache, selectors
    from catalog.models import CachedModel
    from catalog.services import cached_models

    cache, _ = gguf_cache
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    hf_cache.forget_scan()
    cached_models.scan_cache(cache)
    row = CachedModel.objects.get(repo_id=GGUF_REPO)
    assert row.gguf_files == [["tiny-llama-gguf.F16.gguf", "F16"], ["tiny-llama-gguf.F32.gguf", "F32"]]
    url = f"/admin/catalog/cachedmodel/{row.pk}/change/"
    page = admin_client.get(url).content.decode()
    # no Q4_K_M file: the first by name is served until the admin chooses
    assert "tiny-llama-gguf.F16.gguf (F16) ← served" in page
    assert "tiny-llama-gguf.F32.gguf (F32) ← served" not in page
    form = {"enabled": "on", "aliases": "[]", "idle_timeout": "", "dtype": "auto", "device": "", "chat_template": "",
            "tensor_parallel_size": "0", "generation_defaults": "{}", "loads-TOTAL_FORMS": "0", "loads-INITIAL_FORMS": "0", "_save": "Save"}
    refused = admin_client.post(url, {**form, "gguf_file": "Q8_0"})
    assert refused.status_code == 200 and "has no GGUF file `Q8_0`" in refused.content.decode()
    assert admin_client.post(url, {**form, "gguf_file": "f32"}).status_code == 302
    assert selectors.model_settings_map()[GGUF_REPO]["gguf_file"] == "f32"
    assert "tiny-llama-gguf.F32.gguf (F32) ← served" in admin_client.get(url).content.decode()
    safetensors = CachedModel.objects.get(repo_id=SAFETENSORS)
    other = admin_client.post(f"/admin/catalog/cachedmodel/{safetensors.pk}/change/", {**form, "gguf_file": "f32"})
    assert "Only a GGUF model" in other.content.decode()
    hf_cache.forget_scan()


def test_a_gguf_load_parses_the_file_once(gguf_cache):
    """transformers reads the header for the config, the tokenizer and the weights; the loader has it parsed once
    (workers/engine/models/gguf_loading.py) and leaves the gguf package as it found it."""
    import contextlib

    import gguf

    from protocol import ModelRef
    from workers.engine.models.gguf_loading import GgufSource, load_gguf

    _, lone = gguf_cache
    real = gguf.GGUFReader
    parsed = []

    class CountingReader(real):  # the real reader, counted
        def __init__(self, path, *args, **kwargs):
            parsed.append(str(path))
            super().__init__(path, *args, **kwargs)

    gguf.GGUFReader = CountingReader
    try:
        config, tokenizer, model = load_gguf(ModelRef.parse("local/lone"), GgufSource(lone.parent, lone.name),
                                             torch.device("cpu"), torch.float32, lambda *args: None,
                                             lambda report: contextlib.nullcontext())
        assert gguf.GGUFReader is CountingReader
    finally:
        gguf.GGUFReader = real
    assert parsed == [str(lone)]
    assert model.config.num_hidden_layers == config.num_hidden_layers and tokenizer.eos_token
