"""One streamed completion read as raw SSE, classified for the fault benchmarks."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx


@dataclass
class StreamOutcome:
    kind: str  # "ok", "http <status> <code>", "event <code>" (an error event mid-stream), "transport <Error>"
    tokens: int  # chunks with text
    longest_gap: float  # seconds: request to first byte, or between two SSE lines, whichever is longest
    times: list[float]  # arrival time of each text chunk (monotonic)


async def stream_once(http: httpx.AsyncClient, url: str, headers: dict, body: dict) -> StreamOutcome:
    started = last = time.monotonic()
    gap, times, kind = 0.0, [], "transport incomplete"
    try:
        async with http.stream("POST", url, headers=headers, json={**body, "stream": True}) as response:
            if response.status_code != 200:
                text = await response.aread()
                try:
                    code = json.loads(text)["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = "unshaped"
                return StreamOutcome(f"http {response.status_code} {code}", 0, time.monotonic() - started, [])
            async for line in response.aiter_lines():
                now = time.monotonic()
                gap, last = max(gap, now - last), now
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    kind = "ok" if kind == "transport incomplete" else kind
                elif payload.startswith('{"error"'):
                    kind = f"event {json.loads(payload)['error']['code']}"
                elif '"text"' in payload:
                    times.append(now)
    except httpx.HTTPError as exc:
        kind = f"transport {type(exc).__name__}"
    return StreamOutcome(kind, len(times), max(gap, time.monotonic() - last if kind.startswith("transport") else 0), times)
