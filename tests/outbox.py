"""What an engine run in-process emits, per reply channel, for a test to wait on and read."""
from __future__ import annotations

import threading
from collections.abc import Callable

import protocol


class Outbox:
    """Collects what the engine emits, per reply channel, and lets a test wait for it."""

    def __init__(self) -> None:
        self.messages: dict[str, list[dict]] = {}
        self.changed = threading.Condition()

    def emit(self, channel: str, message: dict) -> None:
        with self.changed:
            self.messages.setdefault(channel, []).append(message)
            self.changed.notify_all()

    def wait_for(self, channel: str, done: Callable[[list[dict]], bool], timeout: float = 60.0) -> list[dict]:
        with self.changed:
            assert self.changed.wait_for(lambda: done(self.messages.get(channel, [])), timeout), self.messages.get(channel)
            return list(self.messages[channel])

    def done(self, channel: str) -> bool:
        return any(m["type"] in (protocol.DONE, protocol.ERROR) for m in self.messages.get(channel, []))

    def wait(self, channels: list[str], timeout: float = 120.0) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: all(self.done(c) for c in channels), timeout)

    def wait_tokens(self, channel: str, timeout: float = 60.0) -> None:
        """Until the channel's job produced a token (it is running)."""
        self.wait_for(channel, lambda messages: any(m["type"] in (protocol.DELTA, protocol.DONE) for m in messages),
                      timeout)

    def choices(self, channel: str) -> dict[int, dict]:
        """Per choice index: its token ids and its logprobs (an error fails the test)."""
        found: dict[int, dict] = {}
        for message in self.messages[channel]:
            assert message["type"] != protocol.ERROR, message
            for choice in message.get("choices", []):
                entry = found.setdefault(choice["index"], {"ids": [], "logprobs": []})
                entry["ids"] += choice["token_ids"]
                if choice.get("logprobs"):
                    entry["logprobs"] += choice["logprobs"]["token_logprobs"]
        return found
