"""Tests for the offline tiny-model builder (workers/tiny/builders.py).

No Django needed: run with ``python -m pytest -q tests/test_tiny_models.py -p no:django``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest
import torch
from huggingface_hub import scan_cache_dir

from workers.tiny.builders import build_non_causal_model, build_tiny_model

REPO = "local/tiny-llama"
PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def greet(name):",
    "Q: What is 12 times 12?\nA:",
    "In spring the days",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One shared build: the builder takes a few seconds, so build it once."""
    cache_dir = tmp_path_factory.mktemp("hub")
    build_tiny_model(REPO, cache_dir=cache_dir)
    return cache_dir


@pytest.fixture
def offline(cache, monkeypatch) -> Path:
    """Point the hub at the temp cache and force offline mode in-process.

    huggingface_hub freezes HF_HUB_OFFLINE / HF_HUB_CACHE at import time, so
    setting the env vars alone is not enough once it has been imported.
    """
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    return cache


def _load(cache: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(REPO, cache_dir=cache)
    model = AutoModelForCausalLM.from_pretrained(REPO, cache_dir=cache).eval()
    return tok, model


def _greedy(tok, model, prompt: str, n: int = 40, scores: bool = False):
    enc = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=n, do_sample=False, output_scores=scores, return_dict_in_generate=True
        )
    return out.sequences[0, enc.input_ids.shape[1] :].tolist(), out.scores


def _single_repo(cache: Path, repo_id: str = REPO):
    info = scan_cache_dir(cache)
    assert info.warnings == []
    repos = {r.repo_id: r for r in info.repos}
    assert repo_id in repos
    return repos[repo_id]


def test_cache_layout_matches_hub(cache):
    repo_dir = cache / "models--local--tiny-llama"
    commit = (repo_dir / "refs" / "main").read_text()
    assert len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)
    snap = repo_dir / "snapshots" / commit
    names = {p.name for p in snap.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    for link in snap.iterdir():
        assert link.is_symlink()
        target = os.readlink(link)
        assert not os.path.isabs(target) and target.startswith("../../blobs/")
        blob = (link.parent / target).resolve()
        assert blob.is_file() and not blob.is_symlink()
        assert blob.name == hashlib.sha256(blob.read_bytes()).hexdigest()


def test_scan_cache_dir_finds_repo_with_correct_size(cache):
    repo = _single_repo(cache)
    blobs = list((cache / "models--local--tiny-llama" / "blobs").iterdir())
    assert repo.repo_type == "model"
    assert repo.size_on_disk == sum(b.stat().st_size for b in blobs)
    assert len(repo.revisions) == 1
    (rev,) = repo.revisions
    assert rev.refs == frozenset({"main"})
    assert repo.nb_files == len(blobs)


def test_from_pretrained_offline_by_repo_id(offline):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(REPO)
    model = AutoModelForCausalLM.from_pretrained(REPO)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tok)
    assert model.config.tie_word_embeddings is False
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert tok.convert_ids_to_tokens([tok.bos_token_id, tok.eos_token_id, tok.pad_token_id]) == [
        "<|bos|>", "<|eos|>", "<|pad|>"]


def test_fresh_process_loads_offline_from_env_only(cache):
    code = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"t = AutoTokenizer.from_pretrained({REPO!r})\n"
        f"m = AutoModelForCausalLM.from_pretrained({REPO!r})\n"
        "print(type(m).__name__, len(t))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "LlamaForCausalLM" in res.stdout


def test_param_count_tiny(offline):
    _, model = _load(offline)
    n = sum(p.numel() for p in model.parameters())
    assert 150_000 < n < 5_000_000


def test_tokenizer_round_trip_and_bos(offline):
    tok, _ = _load(offline)
    text = "Hello, world!\n  Two spaces,\ta tab.\n\nx = [1, 2]  # done\nThe END? 3.14 -- ok\n"
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text
    assert len(ids) < len(text)  # merges were actually learned
    with_bos = tok("hi there").input_ids
    assert with_bos[0] == tok.bos_token_id and with_bos[1:] == tok("hi there", add_special_tokens=False).input_ids
    # Tool/thinking markers are single, unsplit tokens that survive skip_special_tokens.
    for marker in ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"]:
        assert len(tok(marker, add_special_tokens=False).input_ids) == 1
    assert tok.decode(tok("<think>x</think>").input_ids, skip_special_tokens=True) == "<think>x</think>"


def test_chat_template_without_and_with_tools(offline):
    tok, _ = _load(offline)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"

    no_think = tok.apply_chat_template(msgs[1:], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    convo = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"temp": 18}'},
        {"role": "assistant", "content": "18C and sunny."},
    ]
    text = tok.apply_chat_template(convo, tools=tools, tokenize=False, add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert "<tools>\n" + json.dumps(tools[0]) + "\n</tools>" in text
    assert "<|im_start|>user\nWeather in Paris?<|im_end|>\n" in text
    assert ("<|im_start|>assistant\n<think>\nUse the tool.\n</think>\n\n<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n') in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 18}\n</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n18C and sunny.<|im_end|>\n")
    ids = tok.apply_chat_template(convo, tools=tools, tokenize=True, return_dict=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_greedy_generation_is_deterministic_varied_and_peaked(offline):
    tok, model = _load(offline)
    outs, gaps = [], []
    for prompt in PROMPTS:
        new, scores = _greedy(tok, model, prompt, scores=True)
        outs.append(new)
        gaps += [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in scores]
    assert len({tuple(o) for o in outs}) == len(PROMPTS)
    assert all(len(set(o)) > 5 for o in outs)
    assert torch.tensor(gaps).median() > 0.3  # clearly peaked, far above float noise

    tok2, model2 = _load(offline)  # a second, fresh load gives the same tokens
    assert [_greedy(tok2, model2, p)[0] for p in PROMPTS] == outs


def test_rebuild_is_idempotent_and_replaces_snapshot(tmp_path):
    first = build_tiny_model("org/rebuild", cache_dir=tmp_path)
    again = build_tiny_model("org/rebuild", cache_dir=tmp_path)
    assert first == again and again.is_dir()
    other = build_tiny_model("org/rebuild", cache_dir=tmp_path, seed=1)
    assert other != first and not first.exists()
    repo = _single_repo(tmp_path, "org/rebuild")
    assert [r.commit_hash for r in repo.revisions] == [other.name]
    blobs = {p.name for p in (tmp_path / "models--org--rebuild" / "blobs").iterdir()}
    assert blobs == {Path(os.readlink(p)).name for p in other.iterdir()}  # no orphans


def test_default_cache_dir_honors_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "envcache"))
    rng = torch.random.get_rng_state()
    snap = build_tiny_model("org/env-model")
    assert torch.equal(rng, torch.random.get_rng_state())  # the seed is applied locally
    assert snap.is_relative_to(tmp_path / "envcache")
    assert _single_repo(tmp_path / "envcache", "org/env-model")


def test_non_causal_model(tmp_path):
    from transformers import AutoConfig, AutoModel

    snap = build_non_causal_model("org/tiny-bert", cache_dir=tmp_path)
    assert _single_repo(tmp_path, "org/tiny-bert")
    config = AutoConfig.from_pretrained(snap)
    assert config.model_type == "bert" and config.architectures == ["BertModel"]
    assert type(AutoModel.from_pretrained(snap)).__name__ == "BertModel"


def test_create_tiny_model_builds_a_cross_encoder_that_sentence_transformers_loads(tmp_path):
    """`create_tiny_model NAME --arch cross-encoder`: a one-label BERT classifier whose pairs carry token types."""
    from sentence_transformers import CrossEncoder

    from catalog.hf_cache import scan_cached_models

    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "INFERENCE_VAR_DIR": str(tmp_path / "var"), "DJANGO_SETTINGS_MODULE": "inference_site.settings"}
    result = subprocess.run([sys.executable, "manage.py", "create_tiny_model", "org/tiny-ce", "--arch", "cross-encoder"],
                            cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    repo = _single_repo(tmp_path / "hub", "org/tiny-ce")
    snapshot = Path(next(iter(repo.revisions)).snapshot_path)
    config = json.loads((snapshot / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 1
    model = CrossEncoder(str(snapshot), device="cpu")
    pair = model.tokenizer("a query", "a document")
    assert set(pair["token_type_ids"]) == {0, 1}  # a text pair, as BERT's tokenizers encode one
    scores = model.predict([("a dog", "a dog runs"), ("a dog", "stock prices fell"), ("q", "the cat sat")])
    assert ((scores > 0) & (scores < 1)).all() and len({round(float(s), 4) for s in scores}) == 3  # sigmoid, varied
    entry = next(m for m in scan_cached_models(tmp_path / "hub") if m.repo_id == "org/tiny-ce")
    assert entry.tasks == ("score",) and entry.modalities == ("text",)
