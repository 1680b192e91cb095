"""Quantized models on the worker: transformers' config for quantizing on load, what quantized weights hold.

torchao's int8 weight-only runs on CPU and CUDA; bitsandbytes' 4/8-bit only on CUDA (refused elsewhere, saying
so). A checkpoint saved quantized needs none of this to load: its config.json's `quantization_config` does it;
one whose weights are quantized without that block is refused (transformers would load random weights).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from protocol.load_options import CUDA_ONLY_QUANTIZATIONS, check_quantization
from workers.engine.errors import ModelLoadError


def quantization_config(name: str, device: torch.device):
    """transformers' config for quantizing on load, or ModelLoadError saying why this worker cannot."""
    check_quantization(name)
    if name in CUDA_ONLY_QUANTIZATIONS:
        if device.type != "cuda":
            raise ModelLoadError(f"Quantization {name} (bitsandbytes) needs a CUDA GPU; this worker runs on "
                                 f"{device.type}. On CPU use torchao-int8.")
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            raise ModelLoadError(f"Quantization {name} needs the bitsandbytes package on the worker "
                                 "(pip install bitsandbytes).") from None
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4") if name == "bnb-4bit" \
            else BitsAndBytesConfig(load_in_8bit=True)
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    return TorchAoConfig(Int8WeightOnlyConfig())


def tensor_bytes(tensor: torch.Tensor) -> int:
    """A tensor's storage: a torchao weight is a tensor subclass whose numel() counts the logical (full-size)
    elements, so its inner tensors (int8 data, scales…) are summed instead."""
    inner = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
    flatten = getattr(inner, "__tensor_flatten__", None)
    if flatten is not None and type(inner) is not torch.Tensor:
        names, _ = flatten()
        parts = (getattr(inner, name) for name in names)  # a DTensor's: its local shard (and its mesh, no tensor)
        return sum(tensor_bytes(part) for part in parts if isinstance(part, torch.Tensor))
    return inner.numel() * inner.element_size()


def release_checkpoint_map(model: torch.nn.Module) -> None:
    """A model quantized on the CPU: its unquantized tensors (embeddings, norms, the LM head) still point into the
    checkpoint's memory map, which keeps the whole file mapped and every page quantizing read resident (a 313 MB
    checkpoint stayed in RSS beside its 97 MB of int8 weights). Copied out, the map and those pages go; so does
    the heap the full-precision weights were quantized from, which glibc keeps unless asked to give it back."""
    with torch.no_grad():
        for module in model.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                if type(param.data) is torch.Tensor:
                    param.data = param.data.clone()
            for name, buffer in list(module.named_buffers(recurse=False)):
                if type(buffer) is torch.Tensor:
                    module._buffers[name] = buffer.clone()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the allocator keeps what it keeps
        pass


def unannounced_quantized_type(repo_id: str, revision: str) -> str | None:
    """The torchao tensor type (Int8Tensor, Int4Tensor…) the repo's safetensors say a weight was saved as, read
    from their headers alone; None if every tensor is a plain one. forgather finds a quantized checkpoint this way
    too; transformers only from config.json's `quantization_config`, and without it loads random weights in place."""
    from safetensors import safe_open

    for path in _safetensors_files(repo_id, revision):
        try:
            with safe_open(path, "pt") as handle:
                metadata = handle.metadata() or {}
        except Exception:  # noqa: BLE001 - an unreadable file: from_pretrained says why when it reads it
            continue
        for value in metadata.values():
            try:
                kind = json.loads(value).get("_type") if value.startswith("{") else None
            except (ValueError, AttributeError):
                continue
            if isinstance(kind, str) and kind != "Tensor":
                return kind
    return None


def _safetensors_files(repo_id: str, revision: str) -> list[str]:
    """The repo's safetensors weight files in the cache: the index's shards, or the one file ([] if neither)."""
    from transformers.utils import cached_file

    def cached(name: str) -> str | None:
        return cached_file(repo_id, name, revision=revision, local_files_only=True,
                           _raise_exceptions_for_missing_entries=False)

    index = cached("model.safetensors.index.json")
    if index:
        try:
            shards = sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []
        return [path for path in map(cached, shards) if path]
    single = cached("model.safetensors")
    return [single] if single else []


def quant_method(config) -> str:
    """A saved quantization_config's method (torchao, bitsandbytes, gptq…), as a dict or an object."""
    method = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    return str(getattr(method, "value", method) or "quantized")
