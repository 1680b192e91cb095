"""Reading an engine's outbox: when a request has finished."""
from __future__ import annotations

import protocol


def finished(messages: list[dict]) -> bool:
    return any(m["type"] in (protocol.DONE, protocol.ERROR) for m in messages)
