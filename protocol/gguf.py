"""GGUF files (llama.cpp's, Ollama's, LM Studio's): how a model name picks one, and what its header says.

Both sides ask: the catalog lists a repo's GGUF files with their quantization type, the worker loads the
one a name or the catalog chose. A repo or folder holding `.gguf` files and no config.json is a GGUF
model; `repo:FILE` names one of its files (as llama.cpp's `-hf repo:QUANT` and Ollama's `name:tag`), the
plain repo name the file chosen in the admin, else the only one, else the `Q4_K_M` one (llama.cpp's
default), else the first by name. Plain Python: the `gguf` package (numpy only) reads the header.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

GGUF_SUFFIX = ".gguf"
DEFAULT_QUANTIZATION = "Q4_K_M"  # llama.cpp's `-hf` takes this one when a repo has several files


@dataclass(frozen=True)
class GgufFacts:
    """What a GGUF file's header says: the llama.cpp architecture and the quantization type (`Q4_1`, `F16`…)."""

    architecture: str
    quantization: str
    context_length: int = 0  # `<architecture>.context_length`; 0: not written


def split_gguf_name(repo_id: str) -> tuple[str, str]:
    """`org/repo:FILE` -> (`org/repo`, `FILE`); a name without `:` -> (name, ""). Hub repo ids never hold `:`."""
    repo, _, file = repo_id.partition(":")
    return repo, file


def gguf_files(folder: Path) -> list[str]:
    """The GGUF files of a snapshot or folder (its top level, sorted); split files (`-00001-of-00003`) are
    left out: transformers reads one file."""
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.name.endswith(GGUF_SUFFIX)]
    except OSError:
        return []
    return sorted(name for name in names if "-of-0" not in name)


def is_gguf_folder(folder: Path) -> bool:
    """A GGUF model: `.gguf` files and no config.json (a repo with both is served from its config.json)."""
    return not (folder / "config.json").is_file() and bool(gguf_files(folder))


def choose_gguf_file(files: list[str], wanted: str = "") -> str:
    """The file `wanted` names (a file name, or a quantization tag such as `Q4_1`, any case), else the default
    above; ValueError naming the files when `wanted` matches none, or there are none."""
    if not files:
        raise ValueError("it holds no .gguf file")
    if wanted:
        exact = [name for name in files if name == wanted or name == wanted + GGUF_SUFFIX]
        tagged = [name for name in files if _tag(wanted) in _tag(name)]
        if exact or tagged:
            return (exact or tagged)[0]
        raise ValueError(f"it has no GGUF file `{wanted}`; its files: {', '.join(files)}")
    if len(files) == 1:
        return files[0]
    return next((name for name in files if _tag(DEFAULT_QUANTIZATION) in _tag(name)), files[0])


def _tag(name: str) -> str:
    return name.upper().replace("-", "_")


@lru_cache(maxsize=256)
def _facts(path: str, size: int, mtime_ns: int) -> GgufFacts:
    from gguf import GGUFReader, LlamaFileType  # imported on first use: most caches hold no GGUF file

    reader = GGUFReader(path)
    architecture = str(reader.fields["general.architecture"].contents())
    context = reader.fields.get(f"{architecture}.context_length")
    context_length = int(context.contents()) if context is not None else 0
    file_type = reader.fields.get("general.file_type")
    if file_type is not None:
        try:
            return GgufFacts(architecture, LlamaFileType(file_type.contents()).name.removeprefix("MOSTLY_")
                             .removeprefix("ALL_"), context_length)
        except ValueError:
            pass
    # no file type written: the type most of its weight matrices have
    counts: dict[str, int] = {}
    for tensor in reader.tensors:
        if len(tensor.shape) > 1:
            counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return GgufFacts(architecture, max(counts, key=counts.__getitem__, default="unknown"), context_length)


def read_gguf_facts(path: Path) -> GgufFacts:
    """The header's facts, read once per file version (the reader maps the file; ~0.1-2 s for a large vocabulary).
    A file that is no GGUF: ValueError."""
    try:
        stat = Path(path).stat()
        return _facts(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    except (OSError, KeyError, ValueError, IndexError) as exc:
        raise ValueError(f"{Path(path).name} is not a readable GGUF file: {exc}") from None
