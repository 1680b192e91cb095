"""Read-only questions about models: what the Hugging Face cache holds, what a name means."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants as hf_constants
from huggingface_hub import scan_cache_dir

from openai_api.errors import APIError

CAUSAL_ARCHITECTURE_SUFFIXES = ("ForCausalLM", "LMHeadModel")
_SCAN_TTL_SECONDS = 2.0


@dataclass(frozen=True)
class CachedModel:
    repo_id: str
    revision: str
    size_on_disk: int
    last_modified: float
    architectures: tuple[str, ...]
    snapshot_path: Path

    @property
    def is_causal_lm(self) -> bool:
        return any(arch.endswith(CAUSAL_ARCHITECTURE_SUFFIXES) for arch in self.architectures)


def _read_architectures(snapshot: Path) -> tuple[str, ...]:
    try:
        config = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError):
        return ()
    return tuple(a for a in (config.get("architectures") or ()) if isinstance(a, str))


def _newest_revision(repo):
    by_ref = {ref: rev for rev in repo.revisions for ref in rev.refs}
    return by_ref.get("main") or max(repo.revisions, key=lambda rev: rev.last_modified, default=None)


def scan_cached_models(cache_dir: str | Path | None = None) -> list[CachedModel]:
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
        models.append(
            CachedModel(
                repo_id=repo.repo_id,
                revision=revision.commit_hash,
                size_on_disk=repo.size_on_disk,
                last_modified=repo.last_modified,
                architectures=_read_architectures(Path(revision.snapshot_path)),
                snapshot_path=Path(revision.snapshot_path),
            )
        )
    return sorted(models, key=lambda m: m.repo_id)


_cache_lock = threading.Lock()
_cache: dict[str, tuple[float, list[CachedModel]]] = {}


def cached_causal_lms() -> list[CachedModel]:
    """The causal LMs in the cache; rescans at most every couple of seconds."""
    key = str(hf_constants.HF_HUB_CACHE)
    with _cache_lock:
        stamp, models = _cache.get(key, (0.0, []))
        if time.monotonic() - stamp > _SCAN_TTL_SECONDS:
            models = [m for m in scan_cached_models(key) if m.is_causal_lm]
            _cache[key] = (time.monotonic(), models)
        return models


def forget_scan() -> None:
    with _cache_lock:
        _cache.clear()


def find_cached_model(name: str) -> CachedModel | None:
    repo_id = name.split("@", 1)[0]
    return next((m for m in cached_causal_lms() if m.repo_id == repo_id), None)


def resolve_model_id(name: str) -> str:
    """The id a client's model name refers to, or 404.

    Names not in the cache pass through when the hub is reachable, so the worker
    can download them on first request; offline they are unknown.
    """
    if find_cached_model(name) is not None:
        return name
    forget_scan()
    if find_cached_model(name) is not None:
        return name
    if hf_constants.HF_HUB_OFFLINE:
        raise APIError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")
    return name
