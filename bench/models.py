"""The benchmark's models: built offline into the Hugging Face cache (random weights, a trained tokenizer)."""
from __future__ import annotations

import os
from pathlib import Path


def prepare_cache() -> Path:
    """The HF cache every process of a run shares (offline), exported for the servers it starts."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from huggingface_hub import constants

    cache = Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)
    os.environ["HF_HUB_CACHE"] = str(cache)
    return cache


def ensure_model(model: str, size: str, cache: Path) -> None:
    from huggingface_hub import scan_cache_dir

    if cache.is_dir() and any(repo.repo_id == model for repo in scan_cache_dir(cache).repos):
        return
    from workers.tiny.builders import build_tiny_model

    print(f"building {model} ({size}) into {cache}")
    build_tiny_model(model, size=size, cache_dir=cache)


def prompt_ids(model: str, length: int) -> list[int]:
    """A natural-text prompt of exactly `length` token ids (BOS first)."""
    from transformers import AutoTokenizer

    from .load import bench_prompts

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    text = " ".join(bench_prompts(16))
    ids = list(tokenizer(text)["input_ids"])
    body = list(tokenizer(" " + text, add_special_tokens=False)["input_ids"])
    while len(ids) < length:
        ids += body
    return ids[:length]
