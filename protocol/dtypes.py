"""The dtype names a model may be loaded in: the canonical ones and forgather's / torch's aliases.

Plain Python (no torch): `serve --dtype`, the catalog's per-model dtype and the worker's loader
(workers/engine/models/model_loader.resolve_dtype) read the one table.
"""
from __future__ import annotations

# alias -> canonical name (the name of the torch dtype)
DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "double": "float64",
}
# `auto`: the device's (bf16 on GPUs that have it, fp16 on older ones, fp32 on CPU: forgather's default);
# `checkpoint`: the dtype the checkpoint was saved in (transformers serve's `auto`).
DTYPE_NAMES: tuple[str, ...] = ("auto", "checkpoint", *DTYPE_ALIASES)


def canonical_dtype(name: str) -> str:
    """`auto`, `checkpoint`, or the canonical name of a dtype alias; ValueError naming the choices otherwise."""
    if not name or name in ("auto", "checkpoint"):
        return name or "auto"
    try:
        return DTYPE_ALIASES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; one of {', '.join(DTYPE_NAMES)}") from None
