"""N-gram prompt lookup (vLLM's `ngram` method, transformers' PromptLookupCandidateGenerator): guess a row's
next tokens as those that followed the latest earlier occurrence of its last n tokens, in its prompt or its
output so far. Free to compute and right wherever the answer quotes its input (summaries, document QA, code
edits), so a step verifies several tokens for the cost of about one.
"""
from __future__ import annotations

import numpy


def lookup(tokens: numpy.ndarray, low: int, high: int, count: int) -> list[int]:
    """Up to `count` tokens that followed the longest match (of `low`..`high` tokens, the latest of the
    longest) of the sequence's last tokens earlier in it; [] when there is none."""
    size = len(tokens)
    if size < low + 1 or count < 1:
        return []
    last = tokens[-1]
    ends = numpy.flatnonzero(tokens[:-1] == last)  # where an earlier occurrence of the last token sits
    if not ends.size:
        return []
    matched = ends if low <= 1 else None
    alive = ends
    for back in range(1, high):
        alive = alive[alive >= back]
        alive = alive[tokens[alive - back] == tokens[size - 1 - back]]
        if not alive.size:
            break
        if back + 1 >= low:
            matched = alive
    if matched is None or not matched.size:
        return []
    start = int(matched[-1]) + 1
    return tokens[start:start + count].tolist()
