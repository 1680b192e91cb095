"""A streaming load generator, and its statistics: with the OpenAI SDK's async client, or with plain aiohttp
(`client="http"`, as vLLM's `benchmark_serving` drives servers: on 2 cores the SDK's own CPU, pydantic
parsing every chunk, takes a core's share from the server it measures)."""
from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import orjson
from openai import AsyncOpenAI


@dataclass
class RequestResult:
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


@dataclass
class LoadResult:
    concurrency: int
    requests: int
    wall_seconds: float
    results: list[RequestResult]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.results)

    @property
    def errors(self) -> int:
        return sum(1 for r in self.results if r.error)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall_seconds if self.wall_seconds else 0.0

    def percentile(self, values: list[float], q: float) -> float | None:
        if not values:
            return None
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    def summary(self) -> dict:
        ttfts = [r.ttft for r in self.results if r.ttft is not None]
        itls = [gap for r in self.results for gap in r.itls]
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "tokens": self.tokens,
            "errors": self.errors,
            "tokens_per_s": round(self.tokens_per_second, 1),
            "ttft_p50_ms": _ms(self.percentile(ttfts, 0.5)),
            "ttft_p95_ms": _ms(self.percentile(ttfts, 0.95)),
            "itl_p50_ms": _ms(self.percentile(itls, 0.5)),
            "itl_p95_ms": _ms(self.percentile(itls, 0.95)),
            "itl_mean_ms": _ms(statistics.fmean(itls) if itls else None),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _tokens_in_dict(chunk: dict) -> int:
    """`_tokens_in` for a chunk read as JSON."""
    if not chunk.get("choices"):
        return 0
    choice = chunk["choices"][0]
    token_ids = choice.get("token_ids")
    if token_ids is not None:
        return len(token_ids)
    return 1 if choice.get("text") else 0


def _tokens_in(chunk) -> int:
    """Tokens a streamed chunk brings: its `token_ids` where the server sends them (ours with
    `return_token_ids`: a chunk per token, also one whose text is held back until its character is
    whole), else 1 for a chunk with text. Inter-token latency is per token, as guidellm and
    `vllm bench serve` count it, not per visible piece of text."""
    if not chunk.choices:
        return 0
    choice = chunk.choices[0]
    token_ids = getattr(choice, "token_ids", None)
    if token_ids is not None:
        return len(token_ids)
    return 1 if choice.text else 0


async def _timed(chunks: AsyncIterator[tuple[int, int | None]], started: float) -> RequestResult:
    """A stream's statistics from its chunks, each read as (tokens it brings, its usage's completion tokens or
    None); an error is counted and reported, never fatal to the run."""
    result = RequestResult()
    last = None
    counted = 0
    try:
        async for arrived, usage in chunks:
            now = time.perf_counter()
            if arrived:
                counted += 1
                if result.ttft is None:
                    result.ttft = now - started
                else:
                    result.itls.extend([(now - last) / arrived] * arrived)
                last = now
            if usage:
                result.tokens = usage
        if not result.tokens:
            result.tokens = counted  # a server without stream usage: one chunk per token
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def stream_one(client: AsyncOpenAI, model: str, prompt: str, max_tokens: int, extra: dict) -> RequestResult:
    async def chunks():
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body=extra or None,
        )
        async for chunk in stream:
            usage = getattr(chunk, "usage", None)
            yield _tokens_in(chunk), usage.completion_tokens if usage else None

    return await _timed(chunks(), time.perf_counter())


async def stream_one_http(session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int,
                          extra: dict) -> RequestResult:
    """`stream_one` with aiohttp: the SSE lines read and parsed as they come, nothing more."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}

    async def chunks():
        async with session.post(url, json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {(await response.text())[:200]}")
            async for line in response.content:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    chunk = orjson.loads(line[6:])
                    usage = chunk.get("usage")
                    yield _tokens_in_dict(chunk), usage["completion_tokens"] if usage else None

    return await _timed(chunks(), time.perf_counter())


def http_session(api_key: str = "bench") -> aiohttp.ClientSession:
    return aiohttp.ClientSession(headers={"Authorization": f"Bearer {api_key}"},
                                 connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=600))


async def run_load(base_url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int,
                   extra: dict | None = None, api_key: str = "bench", client: str = "sdk") -> LoadResult:
    """`len(prompts)` streaming requests, at most `concurrency` in flight at once (`client`: sdk or http)."""
    gate = asyncio.Semaphore(concurrency)
    if client == "http":
        session = http_session(api_key)
        url = base_url.rstrip("/") + "/completions"

        async def one(prompt: str) -> RequestResult:
            return await stream_one_http(session, url, model, prompt, max_tokens, extra or {})
    else:
        sdk = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)

        async def one(prompt: str) -> RequestResult:
            return await stream_one(sdk, model, prompt, max_tokens, extra or {})

    async def gated(prompt: str) -> RequestResult:
        async with gate:
            return await one(prompt)

    started = time.perf_counter()
    results = await asyncio.gather(*[gated(p) for p in prompts])
    wall = time.perf_counter() - started
    await (session.close() if client == "http" else sdk.close())
    return LoadResult(concurrency, len(prompts), wall, list(results))


def bench_prompts(count: int) -> list[str]:
    topics = ["a lighthouse", "the river", "a small robot", "the market", "winter", "a letter", "the garden",
              "an old map", "the train", "a violin", "the harbor", "a clock", "the mountain", "a lantern",
              "the library", "a kite"]
    return [f"Story {i}: once upon a time there was {topics[i % len(topics)]} that" for i in range(count)]
