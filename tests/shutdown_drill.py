"""A graceful stop, drilled: N streams in flight, a signal, and what every client saw (tests and bench)."""
from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field

import httpx

from .live_server import ManagedProcess


@dataclass
class StreamEnd:
    """How one client's stream ended: `[DONE]` seen, error events seen, or cut off (neither)."""
    chunks: int = 0
    done: bool = False
    errors: list[dict] = field(default_factory=list)
    broken: str = ""
    ended_at: float = 0.0  # time.monotonic() when the stream closed
    before_signal: bool = False  # it had ended (all its tokens) before the signal was sent

    @property
    def ended_well(self) -> bool:
        return self.done and not self.broken


def read_stream(base_url: str, headers: dict[str, str], model: str, max_tokens: int, end: StreamEnd,
                first_chunk: threading.Event) -> None:
    """One streamed completion, read by hand (no SDK retries or parsing hides a cut)."""
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True}
    try:
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, headers=headers, timeout=120) as response:
            if response.status_code != 200:
                end.broken = f"status {response.status_code}"
                return
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    end.done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    end.errors.append(event["error"])
                else:
                    end.chunks += 1
                    first_chunk.set()
    except (httpx.HTTPError, ValueError) as exc:
        end.broken = f"{type(exc).__name__}: {exc}"
    end.ended_at = time.monotonic()


def signal_with_streams(process: ManagedProcess, base_url: str, headers: dict[str, str], model: str,
                        signum: int, streams: int = 16, max_tokens: int = 480,
                        exit_timeout: float = 60.0) -> tuple[int, list[StreamEnd], float]:
    """Start `streams` streams, send `signum` once every one has a token, and wait for the process to exit:
    (exit status, each stream's end, seconds from the signal to the exit)."""
    ends = [StreamEnd() for _ in range(streams)]
    started = [threading.Event() for _ in range(streams)]
    readers = [threading.Thread(target=read_stream, args=(base_url, headers, model, max_tokens, end, first))
               for end, first in zip(ends, started)]
    for reader in readers:
        reader.start()
    for first in started:
        first.wait(60)
    signalled = time.monotonic()
    process.process.send_signal(signum)
    status = process.process.wait(exit_timeout)
    took = time.monotonic() - signalled
    for reader in readers:
        reader.join(30)
    for end in ends:  # under load the first streams can finish before the last one's first token
        end.before_signal = end.done and 0 < end.ended_at < signalled
    return status, ends, took


SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
