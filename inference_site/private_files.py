"""Files only this user may read: the var dir, its SQLite database, and the generated SECRET_KEY.

Used by settings at import time, so nothing here imports Django.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

KEY_FILE = "secret_key"


def private_dir(path: Path) -> Path:
    """Create `path` (mode 0700), or take group/other access away from an existing one we own."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    _restrict(path, 0o700)
    return path


def private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 if it is missing (SQLite then keeps that mode), else restrict it."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        _restrict(path, 0o600)


def _restrict(path: Path, mode: int) -> None:
    try:
        if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
            os.chmod(path, mode)
    except OSError:  # not ours, or a read-only mount: leave it as the operator set it
        pass


def secret_key(var_dir: Path) -> str:
    """The key in `var_dir/secret_key`, generated there (mode 0600) on first start.

    Written to a temporary file and linked into place, so processes starting together agree on one key.
    """
    path = var_dir / KEY_FILE
    if not path.exists():
        temporary = var_dir / f".{KEY_FILE}.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    _restrict(path, 0o600)
    return path.read_text().strip()
