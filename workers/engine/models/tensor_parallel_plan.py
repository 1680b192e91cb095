"""What a tensor-parallel load needs, checked before any weight is read (each refusal says why), and
transformers' arguments for one rank's shard; workers/engine/parallel/ runs the ranks."""
from __future__ import annotations

from typing import Any

import torch

from workers.engine.errors import ModelLoadError


def refuse_tensor_parallel(key: str, size: int, why: str) -> None:
    raise ModelLoadError(f"The model `{key}` cannot be served with tensor_parallel_size={size}: {why}.")


def check_tensor_parallel(key: str, config: Any, size: int, kind: str, device: torch.device, quantization: str) -> None:
    """Raise ModelLoadError when `config`'s model cannot run split over `size` ranks on `device`."""
    if kind != "causal":
        refuse_tensor_parallel(key, size, f"tensor parallel serves text-generation models; this one is {kind}")
    saved = getattr(config, "quantization_config", None)
    if quantization or saved is not None:
        refuse_tensor_parallel(key, size, "quantized weights are not sharded by transformers' tensor-parallel plans")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(text, "base_model_tp_plan", None):
        refuse_tensor_parallel(key, size, f"transformers has no tensor-parallel plan for its architecture "
                                          f"({config.model_type})")
    for name in ("num_attention_heads", "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads"):
        heads = getattr(text, name, None)
        if isinstance(heads, int) and heads % size:
            refuse_tensor_parallel(key, size, f"its {name} ({heads}) does not divide by {size}")
    if device.type == "cuda" and device.index not in (None, 0):
        refuse_tensor_parallel(key, size, f"rank r runs on cuda:r, so the worker's device must be cuda or cuda:0, not "
                                          f"{device} (choose the GPUs with CUDA_VISIBLE_DEVICES)")
    if device.type == "cuda" and size > torch.cuda.device_count():
        refuse_tensor_parallel(key, size, f"it asks for {size} GPUs and this machine has {torch.cuda.device_count()}")
    if device.type not in ("cpu", "cuda"):
        refuse_tensor_parallel(key, size, f"tensor parallel runs on CUDA (NCCL) or CPU (gloo), not {device.type}")


def tensor_parallel_kwargs(key: str, config: Any, size: int, kind: str, device: torch.device,
                           quantization: str) -> dict:
    """from_pretrained's arguments for this rank's shard (after the checks): transformers' own plan."""
    from transformers.distributed import DistributedConfig

    check_tensor_parallel(key, config, size, kind, device, quantization)
    return {"distributed_config": DistributedConfig(tp_plan="auto", tp_size=size)}
