"""How a model is loaded beyond device and dtype: quantization, its own code, the attention kernel.

Plain Python, the one list of each choice: the catalog's admin fields, `serve`'s flags and config
file, and the worker's loader (workers/engine/models/model_loader.py) all read them from here.
"""
from __future__ import annotations

# Quantized on load (`serve --quantization`, a model's catalog row). A checkpoint saved quantized
# (a `quantization_config` in its config.json: torchao, bitsandbytes, GPTQ…) loads as it is, with none.
#   torchao-int8: int8 weight-only (torchao), CPU and CUDA;
#   bnb-8bit / bnb-4bit: bitsandbytes' LLM.int8() and NF4, CUDA only (`pip install bitsandbytes`).
QUANTIZATIONS: tuple[str, ...] = ("torchao-int8", "bnb-8bit", "bnb-4bit")
CUDA_ONLY_QUANTIZATIONS: tuple[str, ...] = ("bnb-8bit", "bnb-4bit")
# transformers' attention implementations (`attn_implementation`); empty: the model's default (SDPA where
# it has it). flash_attention_2/3 need the flash-attn package and a CUDA GPU.
ATTN_IMPLEMENTATIONS: tuple[str, ...] = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


def check_quantization(value: str) -> str:
    """The value if it names a quantization ("" for none), else ValueError listing the choices."""
    if value and value not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {value!r}; one of {', '.join(QUANTIZATIONS)}")
    return value


def check_attn_implementation(value: str) -> str:
    """The value if transformers knows it ("" for the model's default; a hub kernel `org/repo` passes), else ValueError."""
    if value and value not in ATTN_IMPLEMENTATIONS and "/" not in value:
        raise ValueError(f"unknown attn_implementation {value!r}; one of {', '.join(ATTN_IMPLEMENTATIONS)}")
    return value
