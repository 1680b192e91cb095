"""Which running rows decode apart from the slab: a row so much longer than the others that keeping it in
the slab would multiply what they hold.

The slab (slab.py) keeps every row as long as its longest, so one long conversation beside short ones makes each
short one hold the long one's length (3,500 tokens beside 31 rows of 100: the slab holds 13 times the tokens).
Until attention reads a block table (docs/benchmarks.md: on the CPU a gather of every row's blocks costs 2-3
times the attention), the runner keeps such a row out of the slab: it decodes in a forward of its own over a cache
of its own length, as the rows of a cache the slab has no store for do. Each row apart costs a forward a step, so
only a row whose absence from the slab saves most of its bytes goes apart, and at most MOST_APART rows at once.
On a CPU (`bench --scenario memory --mixed`: the same throughput, the short rows no longer attending over the long
row's padding) any saving of 64 MiB is worth it; on a GPU, where the weights read again make a forward of its own
cost about a whole step and this is not measured yet, only a saving of a quarter of the KV budget.
"""
from __future__ import annotations

import torch

from workers.engine.execution.kv.budget import KVBudget

APART_LEAST_CPU_BYTES = 64 * 2**20  # on a CPU a row goes apart when that saves this much (a GPU: a quarter budget)
APART_RATIO = 2.0  # the slab with the row must hold at least this many times the tokens of the slab without it + it
MOST_APART = 2  # rows decoded apart at once: each is a forward of its own every step


def least_saved_tokens(setting_bytes: int | None, device: torch.device, budget: KVBudget) -> int | None:
    """The tokens a row's going apart must save (`setting_bytes`, else the device's default), or None: set off
    (negative), or no row's keys and values grow with its length (sliding layers only, recurrent states only)."""
    if not budget.token_bytes or (setting_bytes is not None and setting_bytes < 0):
        return None
    least = setting_bytes if setting_bytes is not None else (
        APART_LEAST_CPU_BYTES if device.type == "cpu" else budget.bytes // 4)
    return -(-least // budget.token_bytes)


def rows_apart(lengths: list[int], apart_already: int, least_saved_tokens: int) -> list[int]:
    """Indices into `lengths` (the cached tokens of the rows that would share the slab) of the rows to decode
    apart instead, longest first: the fewest longest rows (up to MOST_APART in all) whose going leaves the slab
    and them holding within a quarter of the least any such choice holds, if the slab with them would hold
    APART_RATIO times that and at least `least_saved_tokens` more."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    ranked = [lengths[i] for i in order]

    def held(k: int) -> int:  # the slab without the k longest, and those k alone
        return (len(ranked) - k) * (ranked[k] if k < len(ranked) else 0) + sum(ranked[:k])

    most = min(MOST_APART - apart_already, len(ranked) - 1)
    if most < 1:
        return []
    least = min(held(k) for k in range(1, most + 1))
    k = next(k for k in range(1, most + 1) if held(k) <= 1.25 * least)
    if held(0) < APART_RATIO * held(k) or held(0) - held(k) < least_saved_tokens:
        return []
    return order[:k]
