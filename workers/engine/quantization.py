"""Quantized models on the worker: transformers' config for quantizing on load, what quantized weights hold.

torchao's int8 weight-only runs on CPU and CUDA; bitsandbytes' 4/8-bit only on CUDA (refused elsewhere, saying
so). A checkpoint saved quantized needs none of this to load: its config.json's `quantization_config` does it.
"""
from __future__ import annotations

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
        return sum(tensor_bytes(getattr(inner, name)) for name in names)
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


def quant_method(config) -> str:
    """A saved quantization_config's method (torchao, bitsandbytes, gptq…), as a dict or an object."""
    method = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    return str(getattr(method, "value", method) or "quantized")
