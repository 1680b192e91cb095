"""Offline builders of tiny models saved the ways hub repos are: quantized (torchao), or with their own code.

Each starts from the tiny Llama (workers/tiny/builders.py) and changes how it is stored, so the tests
load them through the same `from_pretrained` path a hub repo takes.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .builders import _install_into_cache, _resolve_cache, build_tiny_model

# The repo's own code: a config class and a model class transformers does not know, found through
# config.json's auto_map. The model is Llama's (so its output is the tiny Llama's, token for token).
REMOTE_MODELING = '''"""A tiny model shipped with its own code (loaded only with trust_remote_code)."""
from transformers import LlamaConfig, LlamaForCausalLM


class TinyRemoteConfig(LlamaConfig):
    model_type = "tiny_remote"


class TinyRemoteForCausalLM(LlamaForCausalLM):
    config_class = TinyRemoteConfig
'''


def build_tiny_quantized_model(repo_id: str, cache_dir: str | os.PathLike | None = None,
                               with_config: bool = True) -> Path:
    """The tiny Llama quantized int8 weight-only with torchao and saved so: config.json carries the
    `quantization_config` that makes `from_pretrained` load it quantized (as forgather's finalized models);
    `with_config=False` leaves it out (only the weights' safetensors metadata says they are quantized)."""
    import torch
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TorchAoConfig

    cache = _resolve_cache(cache_dir)
    with tempfile.TemporaryDirectory(prefix="tiny-quantized-") as tmp:
        source = build_tiny_model("local/tiny-llama-unquantized-source", cache_dir=Path(tmp) / "cache")
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32,
                                                     quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))
        out = Path(tmp) / "out"
        model.save_pretrained(out, safe_serialization=True)
        AutoTokenizer.from_pretrained(source).save_pretrained(out)
        if not with_config:
            config = json.loads((out / "config.json").read_text())
            del config["quantization_config"]
            (out / "config.json").write_text(json.dumps(config, indent=2))
        return _install_into_cache(out, cache, repo_id)


def build_tiny_remote_code_model(repo_id: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The tiny Llama as a repo with its own modeling file: model_type `tiny_remote`, which transformers knows
    only from the repo's `modeling_tiny_remote.py` (auto_map), so it loads only with trust_remote_code."""
    import shutil

    cache = _resolve_cache(cache_dir)
    with tempfile.TemporaryDirectory(prefix="tiny-remote-") as tmp:
        source = build_tiny_model("local/tiny-llama-remote-source", cache_dir=Path(tmp) / "cache")
        out = Path(tmp) / "out"
        shutil.copytree(source, out, symlinks=False)
        config = json.loads((out / "config.json").read_text())
        config.update(model_type="tiny_remote", architectures=["TinyRemoteForCausalLM"],
                      auto_map={"AutoConfig": "modeling_tiny_remote.TinyRemoteConfig",
                                "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteForCausalLM"})
        (out / "config.json").unlink()  # a copy of a read-only blob
        (out / "config.json").write_text(json.dumps(config, indent=2))
        (out / "modeling_tiny_remote.py").write_text(REMOTE_MODELING)
        return _install_into_cache(out, cache, repo_id)


def build_tiny_bf16_model(repo_id: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The tiny Llama saved in bfloat16 (config.json's dtype says so), for loads in the checkpoint's dtype."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = _resolve_cache(cache_dir)
    with tempfile.TemporaryDirectory(prefix="tiny-bf16-") as tmp:
        source = build_tiny_model("local/tiny-llama-bf16-source", cache_dir=Path(tmp) / "cache")
        out = Path(tmp) / "out"
        AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(out, safe_serialization=True)
        AutoTokenizer.from_pretrained(source).save_pretrained(out)
        return _install_into_cache(out, cache, repo_id)
