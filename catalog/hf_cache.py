"""What the Hugging Face cache on disk holds, scanned at most every couple of seconds.

Plain huggingface_hub, no database: `catalog.selectors` and `catalog.services` build on it.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from huggingface_hub import constants as hf_constants
from huggingface_hub import scan_cache_dir

from protocol.gguf import choose_gguf_file, gguf_files, is_gguf_folder, read_gguf_facts
from protocol.modalities import CAUSAL_ARCHITECTURE_SUFFIXES, input_modalities, model_kind, model_tasks
from protocol.output_formats import detect_parsers

from .snapshots import Snapshot

SCAN_TTL_SECONDS = 2.0
SCAN_STALE_LIMIT_SECONDS = 10.0  # a scan this old is no longer answered while a new one runs (catalog/snapshots.py)


@dataclass(frozen=True)
class CacheEntry:
    """One model repo in the cache (the catalog's database row is `catalog.models.CachedModel`)."""

    repo_id: str
    revision: str
    size_on_disk: int
    last_modified: float
    architectures: tuple[str, ...]
    snapshot_path: Path
    revisions: tuple[str, ...] = ()
    modalities: tuple[str, ...] = ()  # what it takes as input; empty: nothing this server serves
    tasks: tuple[str, ...] = ()  # generate, transcribe or embed (protocol.modalities.model_tasks)
    parent: str | None = None  # a LoRA adapter's base model (its adapter_config.json's base_model_name_or_path)
    # The tool-call and reasoning parsers its files point to ({tool_parser, reasoning_parser, source}), for a
    # model that generates; the catalog's overrides go over it (protocol.output_formats).
    parsers: dict = field(default_factory=dict, compare=False)
    # A GGUF model (protocol/gguf.py): its files and their quantization types ((file, quantization), …);
    # `gguf_file`: the one this name serves unless the admin chose another ("" for a plain repo)
    gguf_files: tuple[tuple[str, str], ...] = ()
    gguf_file: str = ""
    context_length: int = 0  # a GGUF file's (its header); 0: what config.json says

    @property
    def is_causal_lm(self) -> bool:
        return bool(self.gguf_files) or any(arch.endswith(CAUSAL_ARCHITECTURE_SUFFIXES) for arch in self.architectures)

    @property
    def is_served(self) -> bool:
        """A causal LM, a vision-language model or a speech-to-text model."""
        return bool(self.modalities)


def _read_config(snapshot: Path) -> dict:
    try:
        config = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _adapter_base(snapshot: Path) -> str | None:
    """The base model a LoRA adapter repo names (peft's adapter_config.json), or None."""
    try:
        config = json.loads((snapshot / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    return base if isinstance(base, str) and base and config.get("peft_type", "LORA") == "LORA" else None


ADDED_TOKEN = re.compile(r'"content"\s*:\s*"((?:[^"\\]|\\.)*)"')


def _added_tokens(snapshot: Path) -> list[str]:
    """The added tokens tokenizer.json lists first (read from its head only: the file may be tens of MB)."""
    try:
        with (snapshot / "tokenizer.json").open(encoding="utf-8", errors="replace") as handle:
            head = handle.read(2 << 20)
    except OSError:
        return []
    start = head.find('"added_tokens"')
    end = min((i for i in (head.find('"normalizer"', start), head.find('"pre_tokenizer"', start)) if i > 0),
              default=len(head))
    if start < 0:
        return []
    found = []
    for raw in ADDED_TOKEN.findall(head[start:end]):
        try:
            found.append(json.loads(f'"{raw}"'))
        except ValueError:
            continue
    return found


@lru_cache(maxsize=512)
def _format_facts(snapshot: Path) -> tuple[str, str, tuple[str, ...], bool]:
    """What a snapshot's config.json, tokenizer_config.json and chat_template.jinja say of its output format:
    (model_type, chat template, added tokens, has a response_template); read once per snapshot (a commit's
    files never change)."""
    config = _read_config(snapshot)
    try:
        tokenizer_config = json.loads((snapshot / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        tokenizer_config = {}
    if not isinstance(tokenizer_config, dict):
        tokenizer_config = {}
    template = tokenizer_config.get("chat_template") or ""
    if isinstance(template, list):
        template = "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    try:
        template = str(template) + (snapshot / "chat_template.jinja").read_text()
    except OSError:
        pass
    tokens = [str(t.get("content", "")) for t in (tokenizer_config.get("added_tokens_decoder") or {}).values()
              if isinstance(t, dict)] + _added_tokens(snapshot)
    model_type = config.get("model_type") or (config.get("text_config") or {}).get("model_type") or ""
    return str(model_type), str(template), tuple(tokens), isinstance(tokenizer_config.get("response_template"), dict)


@lru_cache(maxsize=512)
def detected_parsers(snapshot: Path, chat_template: str = "") -> dict:
    """The parsers a snapshot's files point to; `chat_template`: the catalog's template for the model, read in
    place of the files' (the worker renders with it and reads its markers the same way)."""
    model_type, template, tokens, has_response_template = _format_facts(snapshot)
    return detect_parsers(model_type, chat_template or template, tokens, has_response_template).as_dict()


def _newest_revision(repo):
    by_ref = {ref: rev for rev in repo.revisions for ref in rev.refs}
    return by_ref.get("main") or max(repo.revisions, key=lambda rev: rev.last_modified, default=None)


def scan_cached_models(cache_dir: str | Path | None = None) -> list[CacheEntry]:
    """Every model repo in the Hugging Face cache, with what its config says it is."""
    cache_dir = Path(cache_dir or hf_constants.HF_HUB_CACHE)
    if not cache_dir.is_dir():
        return []
    info = scan_cache_dir(cache_dir)
    models = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        revision = _newest_revision(repo)
        if revision is None:
            continue
        if is_gguf_folder(Path(revision.snapshot_path)):
            models.extend(_gguf_entries(repo, revision))
            continue
        config = _read_config(Path(revision.snapshot_path))
        kind = model_kind(config, sentence_transformers=(Path(revision.snapshot_path) / "modules.json").is_file())
        parent = _adapter_base(Path(revision.snapshot_path)) if not config else None
        if parent is not None:  # an adapter generates text as its base does (a text LM: peft adapters here are LoRA)
            kind = "causal"
        models.append(
            CacheEntry(
                repo_id=repo.repo_id,
                revision=revision.commit_hash,
                size_on_disk=repo.size_on_disk,
                last_modified=repo.last_modified,
                architectures=tuple(a for a in (config.get("architectures") or ()) if isinstance(a, str)),
                snapshot_path=Path(revision.snapshot_path),
                revisions=tuple(sorted(rev.commit_hash for rev in repo.revisions)),
                modalities=input_modalities(kind),
                tasks=model_tasks(kind),
                parent=parent,
                parsers=detected_parsers(Path(revision.snapshot_path)) if "generate" in model_tasks(kind) else {},
            )
        )
    return sorted(models, key=lambda m: m.repo_id)


def _gguf_entries(repo, revision) -> list[CacheEntry]:
    """A GGUF repo's entries: the repo itself (the admin's file, else the default one), and `repo:FILE` for each
    file when it holds several (as LM Studio lists every file). A file whose header cannot be read is left out."""
    snapshot = Path(revision.snapshot_path)
    files = []
    for name in gguf_files(snapshot):
        try:
            files.append((name, read_gguf_facts(snapshot / name)))
        except ValueError:
            continue
    if not files:
        return []
    facts_of = dict(files)
    default = facts_of[choose_gguf_file(list(facts_of))]
    common = dict(revision=revision.commit_hash, last_modified=repo.last_modified, snapshot_path=snapshot,
                  revisions=tuple(sorted(rev.commit_hash for rev in repo.revisions)),
                  modalities=input_modalities("causal"), tasks=model_tasks("causal"))
    entries = [CacheEntry(repo_id=repo.repo_id, size_on_disk=repo.size_on_disk, gguf_file="",
                          context_length=default.context_length, parsers=_gguf_parsers(default),
                          architectures=(f"gguf:{default.architecture}",),
                          gguf_files=tuple((name, facts.quantization) for name, facts in files), **common)]
    if len(files) > 1:
        entries += [CacheEntry(repo_id=f"{repo.repo_id}:{name}", size_on_disk=(snapshot / name).stat().st_size,
                               architectures=(f"gguf:{facts.architecture}",), gguf_files=((name, facts.quantization),),
                               gguf_file=name, context_length=facts.context_length, parsers=_gguf_parsers(facts),
                               **common)
                    for name, facts in files]
    return entries


def _gguf_parsers(facts) -> dict:
    """The parsers a GGUF file's chat template points to (its header has no tokenizer_config.json beside it)."""
    return detect_parsers(facts.architecture, facts.chat_template, ()).as_dict()


def gguf_entry_name(repo_id: str, models: list[CacheEntry]) -> str:
    """`repo:TAG` (a quantization type, any case, or a file name) as the entry it means: `repo:FILE` of a repo
    with several GGUF files, the repo itself for a repo with one; the name unchanged when nothing matches."""
    repo, wanted = repo_id.partition(":")[::2]
    if not wanted or any(m.repo_id == repo_id for m in models):
        return repo_id
    files = [m.gguf_file for m in models if m.repo_id.startswith(repo + ":") and m.gguf_file]
    plain = next((m for m in models if m.repo_id == repo and m.gguf_files), None)
    try:
        if files:
            return f"{repo}:{choose_gguf_file(files, wanted)}"
        if plain is not None and choose_gguf_file([name for name, _ in plain.gguf_files], wanted):
            return repo
    except ValueError:
        pass
    return repo_id


_scans_lock = threading.Lock()
_scans: dict[str, Snapshot[list[CacheEntry]]] = {}  # by cache directory


def _scan_of(cache_dir: str) -> Snapshot[list[CacheEntry]]:
    with _scans_lock:
        snapshot = _scans.get(cache_dir)
        if snapshot is None:
            snapshot = _scans[cache_dir] = Snapshot(
                lambda: [m for m in scan_cached_models(cache_dir) if m.is_served],
                SCAN_TTL_SECONDS, SCAN_STALE_LIMIT_SECONDS, f"the model cache scan of {cache_dir}")
        return snapshot


def cached_served_models(fresh: bool = False) -> list[CacheEntry]:
    """The models in the cache this server serves; rescans when `fresh`, and a couple of seconds after
    the last scan (in the background while the last scan is younger than SCAN_STALE_LIMIT_SECONDS)."""
    return _scan_of(str(hf_constants.HF_HUB_CACHE)).get(fresh)


def cached_served_models_now() -> list[CacheEntry] | None:
    """The kept scan when it may still be answered (no disk read in the caller's path), else None."""
    return _scan_of(str(hf_constants.HF_HUB_CACHE)).peek()


def forget_scan() -> None:
    """The cache changed on disk (a scan, a delete): the next read rescans."""
    with _scans_lock:
        snapshots = list(_scans.values())
    for snapshot in snapshots:
        snapshot.forget()
