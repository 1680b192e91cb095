"""Whether the Hugging Face hub can be reached, asked quickly and remembered for a while.

huggingface_hub retries an unreachable hub with backoff (over a minute per file), so a name
that is not in the cache must never reach it blind: offline (HF_HUB_OFFLINE=1, or no route to
the hub) such a name is unknown at once. Plain Python: the web side and workers both ask.
"""
from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit

from huggingface_hub import constants

PROBE_TIMEOUT_SECONDS = 0.5
REMEMBER_SECONDS = 30.0

_lock = threading.Lock()
_answer: tuple[float, bool] = (0.0, False)


def _connects(host: str, port: int, timeout: float) -> bool:
    """A TCP connection within `timeout` (name resolution included, which has no timeout of its own)."""
    result: list[bool] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=attempt, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def hub_reachable() -> bool:
    """False when HF_HUB_OFFLINE is set or the hub's endpoint does not accept a connection quickly."""
    global _answer
    if constants.HF_HUB_OFFLINE:
        return False
    with _lock:
        stamp, reachable = _answer
        if time.monotonic() - stamp < REMEMBER_SECONDS:
            return reachable
        endpoint = urlsplit(constants.ENDPOINT)
        port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
        reachable = bool(endpoint.hostname) and _connects(endpoint.hostname, port, PROBE_TIMEOUT_SECONDS)
        _answer = (time.monotonic(), reachable)
        return reachable
