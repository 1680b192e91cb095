"""Offline builder of a tiny sentence-transformers embedding model (a BERT-style encoder) in the hub cache.

The repo holds what a sentence-transformers repo on the hub holds: the encoder (`config.json`,
`model.safetensors`), its tokenizer, `modules.json` (Transformer -> Pooling -> Normalize),
`1_Pooling/config.json` (mean pooling), `sentence_bert_config.json` and
`config_sentence_transformers.json`. Its config says `is_matryoshka`, so requests may ask for fewer
`dimensions`. `SentenceTransformer(snapshot)` loads it as it is: the tests' reference.

`build_tiny_cross_encoder` writes a cross-encoder the same way: a BERT sequence classifier with one
label and its tokenizer, as the hub's `cross-encoder/*` repos are; `CrossEncoder(snapshot)` loads it.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from workers.tiny.builders import PAD, SIZES, _install_into_cache, _resolve_cache, train_tokenizer

HIDDEN = 64
MAX_SEQ_LENGTH = 128
# The encoder's shapes: the tests' tiny one, and all-MiniLM-L6-v2's (the most used sentence-transformers
# model) for benchmarks, where a forward must cost what a real one does.
ENCODER_SHAPES = {
    "tiny": {"hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
}


def sentence_transformers_files(out: Path, dimension: int, pooling: str = "mean_tokens",
                                max_seq_length: int = MAX_SEQ_LENGTH) -> None:
    """modules.json, the pooling config and the sentence-BERT config of a Transformer -> Pooling -> Normalize repo."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
    pooling_config = {"word_embedding_dimension": dimension, **{f"pooling_mode_{m}": m == pooling for m in modes},
                      "include_prompt": True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                               "do_lower_case": False}, indent=2))
    (out / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}, indent=2))


def build_tiny_encoder(repo_id: str, cache_dir: str | os.PathLike | None = None, seed: int = 0,
                       shape: str = "tiny") -> Path:
    """A random BERT encoder with mean pooling and normalisation, stored as ``repo_id``; returns the snapshot.

    `shape`: one of ENCODER_SHAPES (the tests' tiny one, or MiniLM-L6's for benchmarks)."""
    import torch
    from transformers import BertConfig, BertModel

    tokenizer = train_tokenizer(SIZES["tiny"]["vocab_target"], MAX_SEQ_LENGTH)
    dims = ENCODER_SHAPES[shape]
    config = BertConfig(
        vocab_size=len(tokenizer), **dims, max_position_embeddings=MAX_SEQ_LENGTH, initializer_range=0.2,
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD), is_matryoshka=True,
    )
    with torch.random.fork_rng(devices=[]):  # seed locally, leave the caller's RNG alone
        torch.manual_seed(seed)
        model = BertModel(config).to(torch.float32).eval()
    cache = _resolve_cache(cache_dir)
    with tempfile.TemporaryDirectory(prefix="tiny-encoder-") as tmp:
        out = Path(tmp)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        sentence_transformers_files(out, dims["hidden_size"])
        return _install_into_cache(out, cache, repo_id)


def pair_tokenizer(tokenizer):
    """BERT's text-pair layout on the trained BPE: `BOS a EOS b EOS`, token types 0 then 1, and no chat
    template (sentence-transformers would render a pair through one instead of encoding it as a pair)."""
    from tokenizers import processors

    bos, eos = tokenizer.bos_token, tokenizer.eos_token
    specials = [(bos, tokenizer.bos_token_id), (eos, tokenizer.eos_token_id)]
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B:1 {eos}:1", special_tokens=specials)
    tokenizer.model_input_names = tokenizer.init_kwargs["model_input_names"] = ["input_ids", "token_type_ids",
                                                                               "attention_mask"]
    tokenizer.chat_template = None
    return tokenizer


def build_tiny_cross_encoder(repo_id: str, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """A random BertForSequenceClassification with one label (a reranker's shape), stored as ``repo_id``;
    returns the snapshot. No activation named in its config: CrossEncoder and the server apply a sigmoid."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = pair_tokenizer(train_tokenizer(SIZES["tiny"]["vocab_target"], MAX_SEQ_LENGTH))
    config = BertConfig(
        vocab_size=len(tokenizer), **ENCODER_SHAPES["tiny"], max_position_embeddings=MAX_SEQ_LENGTH,
        initializer_range=0.2, pad_token_id=tokenizer.convert_tokens_to_ids(PAD), num_labels=1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertForSequenceClassification(config).to(torch.float32).eval()
    cache = _resolve_cache(cache_dir)
    with tempfile.TemporaryDirectory(prefix="tiny-cross-encoder-") as tmp:
        out = Path(tmp)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        return _install_into_cache(out, cache, repo_id)


def build_tiny_causal_embedder(repo_id: str, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """The tiny Llama of `build_tiny_model` with a sentence-transformers config that pools its last token
    (a causal LM served for embeddings, as e5-mistral or gte-Qwen are)."""
    import shutil

    from workers.tiny.builders import SIZES as LLAMA_SIZES, build_tiny_model

    cache = _resolve_cache(cache_dir)
    with tempfile.TemporaryDirectory(prefix="tiny-causal-embedder-") as tmp:
        snapshot = build_tiny_model("local/scratch", cache_dir=Path(tmp) / "cache", seed=seed)
        out = Path(tmp) / "out"
        shutil.copytree(snapshot, out, symlinks=False)
        sentence_transformers_files(out, LLAMA_SIZES["tiny"]["hidden_size"], pooling="lasttoken",
                                    max_seq_length=LLAMA_SIZES["tiny"]["max_position_embeddings"])
        return _install_into_cache(out, cache, repo_id)
