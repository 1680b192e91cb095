"""Response pieces that exist only for vLLM's extras, shaped exactly as vLLM's server shapes them."""
from __future__ import annotations

from protocol import PromptLogprob


def prompt_logprobs_body(entries: list[PromptLogprob] | None) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs`: per prompt token None (the first) or {token id: {logprob, rank, decoded_token}},
    the token itself first, then its most likely alternatives."""
    if entries is None:
        return None
    body: list[dict | None] = []
    for entry in entries:
        if entry["logprob"] is None:
            body.append(None)
            continue
        scores = {str(entry["token_id"]): {"logprob": entry["logprob"], "rank": entry["rank"],
                                           "decoded_token": entry["token"]}}
        for rank, (token_id, token, logprob) in enumerate(entry["top"], start=1):
            scores.setdefault(str(token_id), {"logprob": logprob, "rank": rank, "decoded_token": token})
        body.append(scores)
    return body


class RunningUsage:
    """Usage so far, for vLLM's stream_options.continuous_usage_stats (a usage on every chunk)."""

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0

    def add(self, token_ids: list[int]) -> None:
        self.completion_tokens += len(token_ids)

    def body(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}
