"""How many prompt tokens the engine prefills in one step, so a long prompt never stalls running streams.

Every engine step decodes one token for each running stream, then prefills
newcomers. A prefill chunk that costs many decode steps shows up in every stream
as one long inter-token gap. While streams are running, the pacer lets a step
prefill about as many tokens as fit in one decode step's time (measured as it
goes: moving averages of decode-step time and prefill time per token), so a gap
stays near twice the usual one; with nothing to decode, a step takes the whole
`prefill_chunk` and time to first token is all that counts.
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
