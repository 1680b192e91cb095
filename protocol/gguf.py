"""GGUF files (llama.cpp's, Ollama's, LM Studio's): how a model name picks one, and what its header says.

Both sides ask: the catalog lists a repo's GGUF files with their quantization type, the worker loads the
one a name or the catalog chose. A repo or folder holding `.gguf` files and no config.json is a GGUF
model; `repo:FILE` names one of its files (as llama.cpp's `-hf repo:QUANT` and Ollama's `name:tag`), the
plain repo name the file chosen in the admin, else the only one, else the `Q4_K_M` one (llama.cpp's
default), else the first by name. Plain Python (no torch): the few header keys the catalog shows are read
here, the `gguf` package (numpy only) names the file types.
"""
from __future__ import annotations

import os
import struct
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
    chat_template: str = ""  # `tokenizer.chat_template` (the catalog detects the model's parsers from it)


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


# GGUF metadata value types (gguf.GGUFValueType): struct formats of the fixed-size ones; 8 string, 9 array
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _header_values(path: str, wanted: set[str]) -> dict:
    """The `wanted` metadata keys of a GGUF header, read until all are found: arrays (a vocabulary of 150k
    tokens) are skipped, not decoded, which the `gguf` package's reader does for every key (seconds per file)."""
    import mmap
    import struct

    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        if blob[:4] != b"GGUF" or struct.unpack_from("<I", blob, 4)[0] < 2:
            raise ValueError("no GGUF v2/v3 header")
        count = struct.unpack_from("<Q", blob, 16)[0]
        pos, found = 24, {}

        def string(at: int) -> tuple[str, int]:
            size = struct.unpack_from("<Q", blob, at)[0]
            return bytes(blob[at + 8:at + 8 + size]).decode("utf-8", "replace"), at + 8 + size

        def skip(kind: int, at: int) -> int:
            if kind in _FIXED:
                return at + struct.calcsize(_FIXED[kind])
            if kind == _STRING:
                return at + 8 + struct.unpack_from("<Q", blob, at)[0]
            if kind != _ARRAY:
                raise ValueError(f"unknown metadata type {kind}")
            inner, length = struct.unpack_from("<IQ", blob, at)
            at += 12
            if inner in _FIXED:
                return at + length * struct.calcsize(_FIXED[inner])
            for _ in range(length):
                at = skip(inner, at)
            return at

        for _ in range(count):
            key, pos = string(pos)
            kind = struct.unpack_from("<I", blob, pos)[0]
            pos += 4
            if key in wanted or key.endswith(".context_length"):
                if kind in _FIXED:
                    found[key] = struct.unpack_from(_FIXED[kind], blob, pos)[0]
                elif kind == _STRING:
                    found[key] = string(pos)[0]
            pos = skip(kind, pos)
            architecture = found.get("general.architecture")
            if architecture and wanted <= found.keys() and f"{architecture}.context_length" in found:
                break
        return found


@lru_cache(maxsize=256)
def _facts(path: str, size: int, mtime_ns: int) -> GgufFacts:
    values = _header_values(path, {"general.architecture", "general.file_type", "tokenizer.chat_template"})
    architecture = str(values["general.architecture"])
    context_length = int(values.get(f"{architecture}.context_length") or 0)
    template = str(values.get("tokenizer.chat_template") or "")
    from gguf import LlamaFileType  # imported on first use: most caches hold no GGUF file

    if "general.file_type" in values:
        try:
            name = LlamaFileType(values["general.file_type"]).name
            return GgufFacts(architecture, name.removeprefix("MOSTLY_").removeprefix("ALL_"), context_length, template)
        except ValueError:
            pass
    # no file type written: the type most of its weight matrices have (the gguf package reads the tensor table)
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for tensor in GGUFReader(path).tensors:
        if len(tensor.shape) > 1:
            counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return GgufFacts(architecture, max(counts, key=counts.__getitem__, default="unknown"), context_length, template)


def read_gguf_facts(path: Path) -> GgufFacts:
    """The header's facts, read once per file version (the reader maps the file; ~0.1-2 s for a large vocabulary).
    A file that is no GGUF: ValueError."""
    try:
        stat = Path(path).stat()
        return _facts(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    except (OSError, KeyError, ValueError, IndexError, struct.error) as exc:
        raise ValueError(f"{Path(path).name} is not a readable GGUF file: {exc}") from None
