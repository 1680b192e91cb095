"""A model folder on disk served as a cached model, optionally with the weights of one of its training checkpoints.

`serve FOLDER` (and forgather's `-m FOLDER`) serves what `save_pretrained` wrote (or the `.gguf` files it holds;
`serve FILE.gguf` serves one GGUF file); `serve FOLDER -c` (forgather's
`--from-checkpoint`) serves the folder's model with the weights of its latest training checkpoint (a run with
none yet: its own weights, as forgather), and `-c CHECKPOINT` those of one checkpoint: the config, tokenizer,
generation config and any modeling code from the folder, the weights from the checkpoint. Both are linked (never
copied) into the hub cache's layout, so the catalog, `/v1/models` and the workers load them as any other cached
model (the same `from_pretrained`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from datetime import datetime
from pathlib import Path

from huggingface_hub import constants as hf_constants

from protocol.gguf import GGUF_SUFFIX, gguf_files, read_gguf_facts

from .hf_cache import forget_scan, gguf_entry_name, scan_cached_models

logger = logging.getLogger(__name__)

# transformers' weight files, in the order it prefers them: an index names its shards.
WEIGHT_FILES = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json",
                "pytorch_model.bin")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
CHECKPOINTS = "checkpoints"  # forgather keeps a run's checkpoints in FOLDER/checkpoints/checkpoint-<step>
MANIFEST = "checkpoint_manifest.json"  # forgather's: its `timestamp` survives copies, unlike the folder's mtime


def checkpoint_weights(checkpoint: Path) -> list[Path]:
    """The weight files of a checkpoint (or model) folder: an index and the shards it names, or one file; [] if none."""
    for name in WEIGHT_FILES:
        file = checkpoint / name
        if not file.is_file():
            continue
        if not name.endswith(".index.json"):
            return [file]
        try:
            shards = sorted(set(json.loads(file.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{file} is not a weight index: {exc}") from None
        return [file, *(checkpoint / shard for shard in shards)]
    return []


def _saved_at(checkpoint: Path) -> tuple[float, int]:
    """When a checkpoint was saved (its manifest's timestamp, else the folder's mtime), then its step."""
    saved = checkpoint.stat().st_mtime
    try:
        saved = datetime.fromisoformat(json.loads((checkpoint / MANIFEST).read_text())["timestamp"]).timestamp()
    except (OSError, ValueError, KeyError, TypeError):
        pass
    step = checkpoint.name.rpartition("-")[2]
    return saved, int(step) if step.isdigit() else 0


def latest_checkpoint(folder: Path) -> Path | None:
    """A training run's newest checkpoint that holds weights: forgather's `checkpoints/checkpoint-<step>`, or the
    Trainer's `checkpoint-<step>` in the output folder itself; None if the run has none."""
    found = [path for pattern in (f"{CHECKPOINTS}/checkpoint-*", "checkpoint-*") for path in folder.glob(pattern)
             if path.is_dir() and checkpoint_weights(path)]
    return max(found, key=_saved_at) if found else None


def link_local_model(folder: Path, cache_dir: str | Path | None = None, checkpoint: Path | bool | None = None) -> str:
    """The folder as the cached model `local/<folder name>`; `checkpoint` True: with its latest checkpoint's
    weights, a path: with that checkpoint's. A run's checkpoints are never linked themselves. Linking again
    after the folder (or the checkpoint) changed makes a new snapshot."""
    folder = Path(folder).expanduser().resolve()
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file() \
            and not gguf_files(folder):
        raise ValueError(f"{folder} holds no config.json and no .gguf file: not a model folder")
    files = dict(_model_files(folder))
    if checkpoint:
        weights = _weights_of(folder, checkpoint)
        files = {relative: path for relative, path in files.items()
                 if not (len(relative.parts) == 1 and relative.name.endswith(WEIGHT_SUFFIXES))}
        files.update({Path(path.name): path for path in weights})
    return _link_files(folder, f"local/{folder.name}", files, cache_dir)


def link_gguf_file(file: Path, cache_dir: str | Path | None = None) -> str:
    """One GGUF file as the cached GGUF model `local/<file name without .gguf>` (llama.cpp's `-m FILE`)."""
    file = Path(file).expanduser().resolve()
    if not file.is_file() or not file.name.endswith(GGUF_SUFFIX):
        raise ValueError(f"{file} is not a .gguf file")
    read_gguf_facts(file)  # ValueError: not a GGUF file
    return _link_files(file.parent, f"local/{file.name.removesuffix(GGUF_SUFFIX)}", {Path(file.name): file},
                       cache_dir)


def link_gguf(name: str, cache_dir: str | Path | None = None) -> str:
    """`serve FILE.gguf` (the file as `local/<name>`) and `serve FOLDER:FILE` (a folder's GGUF file by name or
    quantization type, as `local/<folder>:FILE`): the catalog's name for it; "" for any other name. ValueError
    when the file is no GGUF or the folder has no such file."""
    path = Path(name).expanduser()
    folder, _, wanted = name.rpartition(":")
    if path.is_file() and name.endswith(GGUF_SUFFIX):
        repo_id = link_gguf_file(path, cache_dir)
    elif folder and wanted and Path(folder).expanduser().is_dir():
        repo_id = f"{link_local_model(Path(folder).expanduser(), cache_dir)}:{wanted}"
    else:
        return ""
    models = scan_cached_models(cache_dir)
    repo_id = gguf_entry_name(repo_id, models)
    if not any(m.repo_id == repo_id for m in models):
        raise ValueError(f"{name} holds no GGUF file `{wanted}`" if wanted else f"{name} is not a readable GGUF file")
    return repo_id


def _link_files(folder: Path, repo_id: str, files: dict[Path, Path], cache_dir: str | Path | None) -> str:
    """Link `files` ({relative path: file}) as the snapshot of `repo_id`; a changed listing makes a new snapshot."""
    repo = Path(cache_dir or hf_constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))
    listing = "".join(f"{relative}\0{path}\0{path.stat().st_size}\0{path.stat().st_mtime_ns}\n"
                      for relative, path in sorted(files.items()))
    commit = hashlib.sha1(f"{folder}\n{listing}".encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    for relative, path in files.items():
        link = snapshot / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            os.symlink(path, link)
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    forget_scan()
    return repo_id


def _model_files(folder: Path):
    """(relative path, path) of the folder's files, but hidden ones and a training run's checkpoints."""
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if not path.is_file() or any(part.startswith(".") for part in relative.parts):
            continue
        if len(relative.parts) > 1 and (relative.parts[0] == CHECKPOINTS or relative.parts[0].startswith("checkpoint-")):
            continue
        yield relative, path


def _weights_of(folder: Path, checkpoint: Path | bool) -> list[Path]:
    if checkpoint is True:  # as forgather: a run without checkpoints is served with its own weights, if it has any
        found = latest_checkpoint(folder) or (folder if checkpoint_weights(folder) else None)
        if found is None:
            raise ValueError(f"{folder} holds no training checkpoint with weights (looked for "
                             f"{CHECKPOINTS}/checkpoint-*/ and checkpoint-*/ holding {' or '.join(WEIGHT_FILES)})")
        checkpoint = found
    checkpoint = Path(checkpoint).expanduser().resolve()
    weights = checkpoint_weights(checkpoint) if checkpoint.is_dir() else []
    if not weights:
        raise ValueError(f"the checkpoint {checkpoint} holds no weights ({' or '.join(WEIGHT_FILES)})")
    missing = [path.name for path in weights if not path.is_file()]
    if missing:
        raise ValueError(f"the checkpoint {checkpoint} lacks the shards its index names: {', '.join(missing)}")
    logger.info("%s: weights from the checkpoint %s", folder.name, checkpoint)
    return weights
