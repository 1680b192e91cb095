"""Random-weight causal LMs with real models' shapes, built offline into the Hugging Face cache.

The GPU scenario needs the cost of a real model's forward (Qwen2.5-0.5B's, Llama-3-8B's) without
downloading one: the same config with random weights and the project's trained tokenizer
(`workers/tiny/builders.py`). Embedding rows past the tokenizer's size are zero, so greedy decoding
never picks an id the tokenizer lacks while the vocabulary matmul keeps its full size.
"""
from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen2.5-0.5B: hidden 896, 24 layers, 14 heads, 2 KV heads, 4864 MLP, tied, vocab 151936.
    "qwen05": dict(arch="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                   num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    # Llama-3-8B: hidden 4096, 32 layers, 32 heads, 8 KV heads, 14336 MLP, untied, vocab 128256.
    "llama8b": dict(arch="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False),
    # A CPU smoke test only (`--quick`): Qwen2's architecture, a forward that costs almost nothing.
    "tiny": dict(arch="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=4096, tie_word_embeddings=True),
}
REPOS = {"qwen05": "local/qwen2.5-0.5b-shaped", "llama8b": "local/llama-3-8b-shaped", "tiny": "local/tiny-qwen2-shaped"}
TOKENIZER_VOCAB = {"qwen05": 8192, "llama8b": 8192, "tiny": 1024}  # the trained BPE's size (a few seconds for 8k)
MAX_POSITIONS = 4096


def ensure_shape(shape: str, cache: Path, device: str, dtype: str) -> str:
    """The shape's repo id, built into `cache` first if missing (on `device`: 8B initialises in seconds on a GPU)."""
    from huggingface_hub import scan_cache_dir

    repo = REPOS[shape]
    if cache.is_dir() and any(r.repo_id == repo for r in scan_cache_dir(cache).repos):
        return repo
    print(f"building {repo} (random weights, {shape} shape, {dtype}) into {cache}", flush=True)
    build_shape(shape, repo, cache, device, dtype)
    return repo


def build_shape(shape: str, repo: str, cache: Path, device: str, dtype: str) -> Path:
    """A seeded random model of `shape` and the project's tokenizer, installed as `repo` in the hub layout."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    from workers.tiny.builders import BOS, EOS, PAD, _save_and_install, train_tokenizer

    spec = dict(SHAPES[shape])
    config_class = Qwen2Config if spec.pop("arch") == "qwen2" else LlamaConfig
    tokenizer = train_tokenizer(TOKENIZER_VOCAB[shape], MAX_POSITIONS)
    bos, eos, pad = (tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD))
    config = config_class(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, max_position_embeddings=MAX_POSITIONS,
                          initializer_range=0.05, rms_norm_eps=1e-6, **spec)
    torch_dtype = torch.float32 if dtype == "auto" else getattr(torch, dtype)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight[len(tokenizer):].zero_()
        model.get_input_embeddings().weight[len(tokenizer):].zero_()
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    snapshot = _save_and_install(model, tokenizer, cache, repo)
    del model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return snapshot


def shape_prompts(tokenizer, count: int, length: int, salt: int = 0) -> list[str]:
    """`count` distinct prompts of about `length` tokens cut from the project's corpus; each starts with its own
    `Request salt-i:` so no two share a prefix (the server's prefix cache has nothing to reuse between them)."""
    from workers.tiny.builders import CORPUS_PATH

    ids = tokenizer(CORPUS_PATH.read_text(), add_special_tokens=False, verbose=False)["input_ids"]  # longer than a prompt
    prompts = []
    for index in range(count):
        start = (salt * 7919 + index * 53) % (len(ids) - length - 1)
        prompts.append(f"Request {salt}-{index}: " + tokenizer.decode(ids[start:start + length - 8]))
    return prompts
