"""Choosing tokens: batched sampling, per-row processors, grammars (llguidance), beam search."""
