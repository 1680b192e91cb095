"""How many prompt tokens the engine prefills in one step, so a long prompt never stalls running streams.

Every engine step decodes one token for each running stream, then prefills
newcomers. A prefill chunk that costs many decode steps shows up in every stream
as one long inter-token gap. While streams are running, the pacer lets a step
prefill as many tokens as fit in `decode_share` of one decode step's time
(measured as it goes: moving averages of decode-step time and prefill time per
token), and at least LEAST_TOKENS, so a gap stays near 1.5 times the usual one;
with nothing to decode, a step takes the whole `prefill_chunk` and time to first
token is all that counts.

Chosen by `bench.run --scenario mixed` (2 cores, 82M model, prompts 32–2,048):
a share of 1.0 left inter-token latency p99 at 2.4-2.5 × p50 (steps with and
without a prefill differ twofold); 0.5 brought it to 1.6 × at the same
throughput once the least chunk went from 32 to 64 tokens (at 2k tokens of
context a 32-token chunk took 89 ms, a 64-token one 92 ms).
"""
from __future__ import annotations

SMOOTHING = 0.2  # weight of the newest measurement in the moving averages
LEAST_TOKENS = 64  # a forward of fewer costs about as much (weights are read once per forward): long prompts would crawl


class PrefillPacer:
    def __init__(self, most_tokens: int, decode_share: float = 0.5) -> None:
        self.most = max(1, most_tokens)
        self.least = min(LEAST_TOKENS, self.most)
        self.share = max(0.0, decode_share)  # prefill time per step, as a multiple of one decode step
        self.decode_seconds: float | None = None
        self.seconds_per_token: float | None = None

    def budget(self, decoding: bool) -> int:
        """Prompt tokens for this step; `decoding`: whether streams are waiting on this step's tokens."""
        if not decoding or self.decode_seconds is None or self.seconds_per_token is None:
            return self.most
        fitting = int(self.share * self.decode_seconds / self.seconds_per_token)
        return max(self.least, min(self.most, fitting))

    def decoded(self, seconds: float) -> None:
        self.decode_seconds = _smooth(self.decode_seconds, seconds)

    def prefilled(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.seconds_per_token = _smooth(self.seconds_per_token, seconds / tokens)


def _smooth(average: float | None, value: float) -> float:
    return value if average is None else (1 - SMOOTHING) * average + SMOOTHING * value
