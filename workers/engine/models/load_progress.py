"""Load progress as events: transformers' weight loop counted, huggingface_hub's downloaded bytes reported."""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from huggingface_hub import snapshot_download

Progress = Callable[[str, "dict | None"], None]

_progress_lock = threading.Lock()


@contextlib.contextmanager
def weights_progress(progress: Progress) -> Iterator[None]:
    """Report transformers' per-tensor loading loop as `weights` progress.

    transformers drives that loop through its own tqdm; while this thread loads, that name
    points at a wrapper that counts items (other threads still get the real tqdm).
    """
    try:
        from transformers import core_model_loading as loading
    except ImportError:  # another transformers layout: start and end only
        yield
        return
    with _progress_lock:
        original = getattr(loading, "tqdm", None)
        if original is None:
            yield
            return
        owner = threading.current_thread()

        def counting_tqdm(iterable=None, *args, **kwargs):
            if threading.current_thread() is not owner or iterable is None:
                return original(iterable, *args, **kwargs)
            return _count(iterable, progress)

        loading.tqdm = counting_tqdm
        try:
            yield
        finally:
            loading.tqdm = original


def _count(iterable, progress: Progress) -> Iterator:
    items = list(iterable)
    total = len(items)
    every = max(1, total // 10)  # about ten events per load, always the first and the last
    for index, item in enumerate(items, 1):
        yield item
        if index == 1 or index == total or index % every == 0:
            progress("weights", {"current": index, "total": total})


def download(repo_id: str, revision: str, progress: Progress) -> None:
    progress("download", {"current": 0, "total": None})
    folder = Path(snapshot_download(repo_id, revision=revision, tqdm_class=bytes_progress(progress)))
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    progress("download", {"current": size, "total": size})


DOWNLOAD_EVENT_SECONDS = 0.25  # the least time between two `download` events while bytes arrive


def bytes_progress(progress: Progress):
    """A tqdm class for `snapshot_download` that reports the bytes written as `download` progress while they
    arrive (its "snapshot_download" bar, fed by every file's download), at most every DOWNLOAD_EVENT_SECONDS;
    its bars print nothing."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    class BytesProgress(hub_tqdm):
        def __init__(self, *args, name: str | None = None, **kwargs) -> None:
            self.reports, self.written, self.said = name == "huggingface_hub.snapshot_download", 0, 0.0
            kwargs["disable"] = True
            super().__init__(*args, name=name, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if self.reports and n:
                self.written += int(n)
                now = time.monotonic()
                if now - self.said >= DOWNLOAD_EVENT_SECONDS or (self.total and self.written >= self.total):
                    self.said = now
                    progress("download", {"current": self.written, "total": int(self.total) if self.total else None})
            return super().update(n)

    return BytesProgress
