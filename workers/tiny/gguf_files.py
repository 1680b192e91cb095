"""Tiny GGUF models written offline with the `gguf` package, as llama.cpp's convert_hf_to_gguf.py writes them.

`write_llama_gguf` turns a Llama checkpoint with a byte-level BPE tokenizer (the tiny builders') into one
GGUF file: llama.cpp's tensor names, Q and K rows permuted as llama.cpp stores them (transformers permutes
them back), the vocabulary, merges, special tokens and chat template as `tokenizer.ggml.*`. Weights stay
F32 (or F16), so the same weights loaded from safetensors and from the GGUF give the same logits.
`build_tiny_gguf_model` stores such a file as a hub repo of its own (no config.json: a GGUF repo).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .builders import _install_into_cache, _resolve_cache, build_tiny_model

# llama.cpp's token types (gguf.TokenType): what transformers adds as special / plain added tokens
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4


def _permute(weight, heads: int):
    """llama.cpp's `LlamaModel.permute`: rotary halves interleaved, as its rope kernel reads Q and K."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_llama_gguf(model_folder: Path, out: Path, architecture: str = "llama", half: bool = False) -> Path:
    """Write the Llama checkpoint in `model_folder` (config.json, safetensors, tokenizer.json) as one GGUF file.
    `architecture` other than llama writes the same tensors under another name (a file transformers refuses)."""
    import gguf
    import numpy as np
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(model_folder)
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype="float32")
    writer = gguf.GGUFWriter(str(out), architecture)
    writer.add_name(Path(model_folder).name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if half else gguf.LlamaFileType.ALL_F32)

    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    added = {token.content: token for token in tokenizer.backend_tokenizer.get_added_tokens_decoder().values()}
    special = set(tokenizer.all_special_tokens)
    types = [CONTROL if token in special else USER_DEFINED if token in added else NORMAL for token in tokens]
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        array = tensor.detach().numpy()
        if name.endswith("q_proj.weight"):
            array = _permute(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = _permute(array, config.num_key_value_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"no GGUF name for the tensor {name}")
        # llama.cpp keeps norms (1-D) in F32 whatever the file type
        writer.add_tensor(gguf_name, array.astype(np.float16 if half and array.ndim > 1 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def build_tiny_gguf_model(repo_id: str, source: Path | None = None, cache_dir: str | os.PathLike | None = None,
                          types: tuple[str, ...] = ("F32",), architecture: str = "llama") -> Path:
    """Store GGUF files of the tiny Llama at `source` (a snapshot folder; None: a fresh `tiny` build) as the repo
    `repo_id`, holding only those files: `<name>.F32.gguf` and/or `<name>.F16.gguf` (`types`), as a hub GGUF
    repo lists one file per quantization. Returns the snapshot."""
    cache = _resolve_cache(cache_dir)
    with tempfile.TemporaryDirectory(prefix="tiny-gguf-") as tmp:
        if source is None:
            source = build_tiny_model("local/tiny-gguf-source", cache_dir=Path(tmp) / "cache")
        out = Path(tmp) / "out"
        out.mkdir()
        for kind in types:
            if kind not in ("F32", "F16"):
                raise ValueError(f"unknown GGUF type {kind!r}: F32 or F16")
            write_llama_gguf(Path(source), out / f"{repo_id.rpartition('/')[2]}.{kind}.gguf", architecture,
                             half=kind == "F16")
        return _install_into_cache(out, cache, repo_id)
