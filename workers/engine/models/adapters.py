"""LoRA adapters (peft) served over their base model: one copy of the base, many adapters, mixed batches.

An adapter is a repo in the cache holding `adapter_config.json` (its `base_model_name_or_path` names
the base). Loading one loads its base first if this worker does not hold it yet (as a model of its
own), then injects the adapter's LoRA layers into the base's modules (`PeftModel`, on the engine
thread, between steps): the base's weights are never loaded twice. Every tuner layer is left with no
active adapter, so a forward without `adapter_names` is the base model's own (beam search, prompt
scoring and anything else that calls the model directly); for a batch holding adapter rows the runner
adds each row's adapter term (workers/engine/models/lora_batch.py, or peft's mixed-adapter forward with
`adapter_names`, one per row and `__base__` for the base's rows, for variants that does not serve),
so requests for different adapters and for the base decode in one batch.

The adapter's `LoadedModel` shares the base's modules and tokenizer, with `adapter` (its peft name)
and `base_key` (the base model's key: its requests run in the base's runner).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch
from transformers.utils import cached_file

from protocol import ModelRef
from workers.engine.errors import ModelLoadError
from workers.engine.models.lora_batch import dense_lora
from workers.engine.models.model_loader import LoadedModel

BASE_ROW = "__base__"  # peft's name for a row without an adapter in a mixed batch


@dataclasses.dataclass
class AdapterFiles:
    """What the loader thread found: the adapter's folder, its base, and the base if it had to be loaded."""

    ref: ModelRef
    folder: Path
    base: ModelRef
    base_loaded: LoadedModel | None = None


def adapter_base(ref: ModelRef) -> tuple[Path, ModelRef] | None:
    """(the adapter's folder, its base) when `ref` is a LoRA adapter in the cache, else None."""
    if ":" in ref.repo_id:  # `repo:FILE`: a GGUF file (protocol/gguf.py), never an adapter
        return None
    path = cached_file(ref.repo_id, "adapter_config.json", revision=ref.branch, local_files_only=True,
                       _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False)
    if not path:
        return None
    try:
        config = json.loads(Path(path).read_text())
        base = str(config["base_model_name_or_path"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"The adapter `{ref.key}` has no readable base model in adapter_config.json: {exc}") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise ModelLoadError(f"The adapter `{ref.key}` is {config.get('peft_type')}; only LoRA adapters are served.")
    return Path(path).parent, ModelRef.parse(base)


def peft_name(key: str) -> str:
    """A module-safe name for peft (repo ids hold dots and slashes)."""
    return "lora_" + hashlib.sha1(key.encode()).hexdigest()[:12]


def _no_active_adapter(model: torch.nn.Module) -> None:
    """Calls without `adapter_names` compute the base model alone."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module._active_adapter = []


def attach(base: LoadedModel, files: AdapterFiles) -> LoadedModel:
    """Inject the adapter into the base's modules; returns the adapter's LoadedModel (sharing the base's)."""
    from peft import PeftModel

    name = peft_name(files.ref.key)
    before = sum(p.numel() * p.element_size() for p in base.model.parameters())
    try:
        if base.peft is None:
            base.peft = PeftModel.from_pretrained(base.model, str(files.folder), adapter_name=name,
                                                  torch_device=str(base.device))
        elif name not in base.peft.peft_config:
            base.peft.load_adapter(str(files.folder), adapter_name=name, torch_device=str(base.device))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"The adapter `{files.ref.key}` could not be loaded onto `{files.base.key}`: {exc}") from exc
    base.peft.eval()
    _no_active_adapter(base.model)
    dense_lora(base.peft).changed()
    added = sum(p.numel() * p.element_size() for p in base.model.parameters()) - before
    return dataclasses.replace(base, model_id=files.ref.repo_id, revision=files.ref.branch, memory_bytes=max(added, 0),
                               adapter=name, base_key=files.base.key, peft=None,
                               generation_defaults=dict(base.generation_defaults))


def detach(base: LoadedModel, adapter: LoadedModel) -> None:
    """Take the adapter's layers out of its base; the last one out leaves the base's plain modules."""
    peft = base.peft
    if peft is None or adapter.adapter not in peft.peft_config:
        return
    remaining = [name for name in peft.peft_config if name != adapter.adapter]
    if not remaining:
        base.model = peft.unload()  # the LoRA layers replaced by their base layers, in place
        base.peft = None
        return
    if peft.active_adapter == adapter.adapter:  # PeftModel's forward reads its active adapter's config
        peft.set_adapter(remaining[0])
    peft.delete_adapter(adapter.adapter)
    _no_active_adapter(base.model)
    dense_lora(peft).changed()


def adapter_names(rows) -> list[str] | None:
    """One peft adapter name per row (None: no row has one, a plain forward)."""
    names = [getattr(seq.request.model, "adapter", None) for seq in rows]
    return [name or BASE_ROW for name in names] if any(names) else None
