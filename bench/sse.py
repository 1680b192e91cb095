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
    gap_ended: float = 0.0  # when the longest gap ended (monotonic)
    first_line: str = ""  # the line that ended it ("" for the response's head, or a transport error)
    request_id: str = ""  # the completion's id, as the ledger names the request
    completion_tokens: int | None = None  # the usage the server reported (stream_options.include_usage)


async def stream_once(http: httpx.AsyncClient, url: str, headers: dict, body: dict) -> StreamOutcome:
    started = last = time.monotonic()
    gap, times, kind = 0.0, [], "transport incomplete"
    gap_ended, gap_line = started, ""
    request_id, completion_tokens = "", None
    try:
        async with http.stream("POST", url, headers=headers, json={**body, "stream": True}) as response:
            if response.status_code != 200:
                text = await response.aread()
                try:
                    code = json.loads(text)["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = "unshaped"
                now = time.monotonic()
                return StreamOutcome(f"http {response.status_code} {code}", 0, now - started, [], now, "")
            async for line in response.aiter_lines():
                now = time.monotonic()
                if now - last > gap:
                    gap, gap_ended, gap_line = now - last, now, line[:60]
                last = now
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    kind = "ok" if kind == "transport incomplete" else kind
                elif payload.startswith('{"error"'):
                    kind = f"event {json.loads(payload)['error']['code']}"
                else:
                    if '"text"' in payload:
                        times.append(now)
                    if not request_id or '"usage":{' in payload.replace(" ", ""):
                        chunk = json.loads(payload)
                        request_id = request_id or chunk.get("id", "")
                        if chunk.get("usage"):
                            completion_tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        kind = f"transport {type(exc).__name__}"
    now = time.monotonic()
    if kind.startswith("transport") and now - last > gap:
        gap, gap_ended, gap_line = now - last, now, ""
    return StreamOutcome(kind, len(times), gap, times, gap_ended, gap_line, request_id, completion_tokens)
