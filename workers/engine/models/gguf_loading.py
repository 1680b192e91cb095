"""GGUF models (llama.cpp's files) loaded through transformers' GGUF support, dequantized into the chosen dtype.

`model_loader.load_model` hands a model over here when its name is `repo:FILE` or its snapshot holds `.gguf`
files and no config.json (protocol/gguf.py says which file a name means). transformers reads the config and
the tokenizer (vocabulary, merges, special tokens, chat template) from the file's header and dequantizes its
tensors; an architecture it cannot read is refused here with its reason, before any weight is read.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download, snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError

from protocol import ModelRef
from protocol.context_length import context_length
from protocol.gguf import choose_gguf_file, gguf_files, is_gguf_folder, read_gguf_facts, split_gguf_name
from protocol.hub import hub_reachable
from workers.engine.errors import ModelLoadError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GgufSource:
    """One GGUF file to load: the repo's snapshot folder and the file's name in it."""

    folder: Path
    file: str

    @property
    def path(self) -> Path:
        return self.folder / self.file


def _cached_snapshot(repo_id: str, revision: str) -> Path | None:
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def find_gguf(ref: ModelRef, chosen: str = "") -> GgufSource | None:
    """The GGUF file a model name means (`repo:FILE`, else the catalog's `chosen` file or the default one), or
    None for a model that is no GGUF repo. Online, a named file not cached is downloaded alone (never the
    repo's other quantizations); ModelLoadError when the repo has no such file."""
    repo_id, wanted = split_gguf_name(ref.repo_id)
    wanted = wanted or chosen
    named = ":" in ref.repo_id
    folder = _cached_snapshot(repo_id, ref.branch)
    if folder is not None and is_gguf_folder(folder):
        names = gguf_files(folder)
    elif folder is None and hub_reachable():  # not cached: the hub's listing says whether it is a GGUF repo
        names = _hub_gguf_files(repo_id, ref.branch)
        if names is None and not named:
            return None  # no GGUF repo (or none at all): the usual load says what is wrong
    else:
        names = None
    if names is None:
        if not named:
            return None
        raise ModelLoadError(f"The model `{ref.key}` is no GGUF repo in the cache (`.gguf` files and no "
                             "config.json)", not_found=True)
    try:
        name = choose_gguf_file(names, wanted)
    except ValueError as exc:
        raise ModelLoadError(f"The model `{ref.key}`: {exc}", not_found=True) from None
    if folder is None or not (folder / name).is_file():
        folder = Path(hf_hub_download(repo_id, name, revision=ref.branch)).parent
    return GgufSource(folder, name)


def _hub_gguf_files(repo_id: str, revision: str) -> list[str] | None:
    """A hub repo's top-level `.gguf` files when it is a GGUF repo (no config.json), else None."""
    from huggingface_hub import list_repo_files
    from huggingface_hub.errors import HfHubHTTPError

    try:
        listed = list_repo_files(repo_id, revision=revision)
    except (HfHubHTTPError, OSError, ValueError):
        return None
    names = sorted(name for name in listed if name.endswith(".gguf") and "/" not in name and "-of-0" not in name)
    return names if names and "config.json" not in listed else None


def gguf_bytes(ref: ModelRef) -> int | None:
    """The size of the GGUF file a cached GGUF model loads (the catalog's `chosen` file aside), else None."""
    try:
        source = find_gguf(ref) if _cached_snapshot(split_gguf_name(ref.repo_id)[0], ref.branch) else None
    except ModelLoadError:
        return None
    return source.path.stat().st_size if source is not None else None


def _refusal(ref: ModelRef, source: GgufSource, exc: Exception) -> ModelLoadError:
    """transformers' refusal of a file, said with the file, its architecture and what to do."""
    try:
        facts = read_gguf_facts(source.path)
        what = f"its architecture `{facts.architecture}` ({facts.quantization})"
    except ValueError:
        what = "its header"
    import transformers

    reason = str(exc).rstrip(".")
    return ModelLoadError(f"The model `{ref.key}`'s GGUF file {source.file} cannot be loaded by transformers "
                          f"{transformers.__version__}: {what}: {reason}. Serve the original (safetensors) repo "
                          "instead, or a GGUF of an architecture transformers reads.")


@contextmanager
def each_file_parsed_once() -> Iterator[None]:
    """Within it, each GGUF file's header is parsed once, and each architecture's tensor-name table built once.
    transformers parses the header anew for the config, the tokenizer and the weights (`gguf.GGUFReader` in
    `load_gguf_checkpoint`: 1.5 s a time for SmolLM2's 49k-token vocabulary), and builds llama.cpp's name table
    for every module of the model (`gguf.get_tensor_name_map`, 397 times for SmolLM2: 6.4 s). Both are read-only
    once built, so one serves every caller; loads that overlap take turns. SmolLM2's load: 17 s -> 8 s."""
    import gguf

    with _ONE_PATCH_AT_A_TIME:  # two loads at once would each restore the other's stand-ins
        originals = {"GGUFReader": gguf.GGUFReader, "get_tensor_name_map": gguf.get_tensor_name_map}
        built: dict[tuple, object] = {}

        def once(name: str):
            def build(*args, **kwargs):
                key = (name, *(os.fspath(arg) if isinstance(arg, os.PathLike) else arg for arg in args),
                       *sorted(kwargs.items()))
                if key not in built:
                    built[key] = originals[name](*args, **kwargs)
                return built[key]
            return build

        for name in originals:
            setattr(gguf, name, once(name))
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(gguf, name, original)


_ONE_PATCH_AT_A_TIME = threading.RLock()


def load_gguf(ref: ModelRef, source: GgufSource, device: torch.device, dtype, report, weights_progress,
              attn_implementation: str = ""):
    """(config, tokenizer, model) of one GGUF file, the weights dequantized into `dtype` on `device`;
    `weights_progress(report)`: the context that reports transformers' tensor loop as `weights` progress."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    folder, file = str(source.folder), source.file
    try:
        with each_file_parsed_once():
            config = AutoConfig.from_pretrained(folder, gguf_file=file)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
            report("config", None)
            with weights_progress(report):
                model = AutoModelForCausalLM.from_pretrained(
                    folder, gguf_file=file, config=config, dtype=dtype,
                    **({"attn_implementation": attn_implementation} if attn_implementation else {}))
    except (OSError, ValueError, KeyError, RuntimeError, ImportError, NotImplementedError) as exc:
        refusal = _refusal(ref, source, exc)
        logger.warning("%s", refusal)
        raise refusal from exc
    model.to(device)
    logger.info("loaded the GGUF file %s (%s) of %s on %s as %s in %.1fs", file,
                read_gguf_facts(source.path).quantization, ref.key, device, model.dtype, time.monotonic() - started)
    return config, tokenizer, model


def gguf_model_fields(ref: ModelRef, source: GgufSource, device: torch.device, dtype, report, weights_progress,
                      quantization: str = "", attn_implementation: str = "") -> dict:
    """The fields of model_loader's LoadedModel for a GGUF file (it builds the LoadedModel: no import back)."""
    if quantization:  # transformers' GGUF loader is a quantizer of its own: it takes no second one
        logger.warning("%s: a GGUF model is loaded dequantized into its dtype; quantization %s not applied",
                       ref.key, quantization)
    report("processor", None)
    config, tokenizer, model = load_gguf(ref, source, device, dtype, report, weights_progress, attn_implementation)
    model.eval()
    return dict(model_id=ref.repo_id, revision=ref.branch, model=model, tokenizer=tokenizer, device=device,
                max_model_len=gguf_context_length(config, tokenizer), eos_token_ids=gguf_eos_ids(model, tokenizer),
                kind="causal")


def gguf_eos_ids(model, tokenizer) -> list[int]:
    """EOS ids: the file's (config / generation config) and the tokenizer's."""
    found: list[int] = []
    for value in (getattr(model.generation_config, "eos_token_id", None), model.config.eos_token_id,
                  tokenizer.eos_token_id):
        for token in (value if isinstance(value, list) else [value]):
            if isinstance(token, int) and token not in found:
                found.append(token)
    return found


def gguf_context_length(config, tokenizer) -> int:
    return context_length(config.to_dict(), getattr(tokenizer, "model_max_length", None))
