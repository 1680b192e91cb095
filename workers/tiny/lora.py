"""Offline builder of a tiny LoRA adapter (peft) over a tiny model already in the hub cache.

Random, non-zero A and B matrices (peft's `init_lora_weights=False`) on every attention and MLP
projection, so the adapter's greedy output differs from its base's; `adapter_config.json` names the
base by its repo id, as an adapter on the hub does. `PeftModel.from_pretrained(base, snapshot)` loads it:
the tests' reference.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from workers.tiny.builders import _install_into_cache, _resolve_cache

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_tiny_lora(repo_id: str, base: str, cache_dir: str | os.PathLike | None = None, seed: int = 0,
                    rank: int = 8) -> Path:
    """A LoRA adapter of `base` (a repo id in the same cache) stored as ``repo_id``; returns the snapshot."""
    import torch
    from huggingface_hub import snapshot_download
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    cache = _resolve_cache(cache_dir)
    base_path = snapshot_download(base, cache_dir=cache, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False,
                        lora_dropout=0.0, task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):  # seed locally, leave the caller's RNG alone
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    with tempfile.TemporaryDirectory(prefix="tiny-lora-") as tmp:
        out = Path(tmp)
        peft_model.save_pretrained(out, safe_serialization=True)
        import json

        adapter_config = json.loads((out / "adapter_config.json").read_text())
        adapter_config["base_model_name_or_path"] = base  # the repo id, not the snapshot path it was built from
        (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True))
        (out / "README.md").unlink(missing_ok=True)
        return _install_into_cache(out, cache, repo_id)
