"""Services for API keys: issuing them, and the local key file `serve` hands to local clients."""
from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from .models import APIKey, hash_key


def issue_key(name: str) -> tuple[APIKey, str]:
    return APIKey.issue(name)


def key_file_path(port: int) -> Path:
    """Per-port, so a client of http://127.0.0.1:PORT finds the key of the server on PORT."""
    return Path(settings.INFERENCE["KEY_DIR"]) / f"{port}.key"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
    os.chmod(path, 0o600)


def ensure_local_key(port: int) -> tuple[str, Path, bool]:
    """The key in this port's key file if it is still valid, else a new one written there.

    Returns (raw key, file path, whether it was created now).
    """
    path = key_file_path(port)
    if path.exists():
        raw_key = path.read_text().strip()
        if APIKey.objects.filter(hashed_key=hash_key(raw_key), revoked=False).exists():
            return raw_key, path, False
    _, raw_key = issue_key(f"local serve :{port}")
    _write_private(path, raw_key)
    return raw_key, path, True
