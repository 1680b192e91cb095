"""One step's tokens for many rows at once: tensor operations over the batch, one copy to the host.

Per row, a choice is exactly what `Sampler.choose` would make of that row alone: the same float
operations in the same order (temperature, then Hugging Face's top-k, top-p and min-p, as its
warpers compute them, with each row's own value), the same per-request generator for the draw.
Rows whose sampling needs the whole history (repetition and n-gram penalties, bad words,
presence/frequency penalties), a logit bias or typical-p go through `Sampler.choose` one by one;
the common rows (greedy or temperature/top-k/top-p/min-p, EOS held off, grammar masks,
logprobs) cost a handful of batched operations and one `.tolist()` per step.
"""
from __future__ import annotations

import torch

from workers.engine.sample.sampling import Sampler, TokenChoice

NEG_INF = -float("inf")


def choose_batch(samplers: list[Sampler], logits: torch.Tensor, histories: list[tuple[list[int], list[int]]],
                 allowed: list[torch.Tensor | None]) -> list[TokenChoice | None]:
    """Row i's next token from `logits[i]` (the model's scores) under `samplers[i]`; `histories[i]` is
    (prompt ids, completion ids); `allowed[i]` its grammar mask or None. None for a grammar dead end."""
    choices: list[TokenChoice | None] = [None] * len(samplers)
    rows = []
    for i, sampler in enumerate(samplers):
        if sampler.batchable:
            rows.append(i)
        else:
            choices[i] = sampler.choose(logits[i], *histories[i], allowed[i])
    if not rows:
        return choices
    every = len(rows) == len(samplers)
    raw = logits if every else logits[rows]
    scores = raw.float()
    if scores.data_ptr() == raw.data_ptr():
        scores = scores.clone()
    batch = [samplers[i] for i in rows]
    _hold_off_eos(scores, batch, [len(histories[i][1]) for i in rows])
    dead = _apply_grammars(scores, [allowed[i] for i in rows])
    tokens = _draw(scores, batch)
    picked = _logprobs(raw, tokens, batch)
    ids = tokens.tolist()
    for position, i in enumerate(rows):
        if position in dead:
            continue
        logprob, top = picked.get(position, (None, []))
        choices[i] = TokenChoice(ids[position], logprob, top)
    return choices


def _hold_off_eos(scores: torch.Tensor, batch: list[Sampler], generated: list[int]) -> None:
    """EOS can't come while `ignore_eos`, nor before `min_tokens`."""
    rows = [r for r, (s, n) in enumerate(zip(batch, generated))
            if s.eos_token_ids and (s.params.ignore_eos or n < s.params.min_tokens)]
    if not rows:
        return
    eos = sorted({t for r in rows for t in batch[r].eos_token_ids})
    if all(batch[r].eos_token_ids == batch[rows[0]].eos_token_ids for r in rows):
        if len(rows) == len(batch):  # every row (ignore_eos in a whole batch): columns, no index tensors
            scores[:, eos] = NEG_INF
        else:
            scores[torch.tensor(rows)[:, None], torch.tensor(eos)[None, :]] = NEG_INF
    else:
        for r in rows:
            scores[r, batch[r].eos_token_ids] = NEG_INF


def _apply_grammars(scores: torch.Tensor, masks: list[torch.Tensor | None]) -> set[int]:
    """Grammar masks applied; the rows whose grammar allows nothing (dead ends)."""
    rows = [r for r, mask in enumerate(masks) if mask is not None]
    if not rows:
        return set()
    index = torch.tensor(rows)
    allowed = torch.stack([masks[r] for r in rows]).to(scores.device)
    constrained = scores[index].masked_fill(~allowed, NEG_INF)
    scores[index] = constrained
    alive = torch.isfinite(constrained).any(-1).tolist()
    return {r for r, ok in zip(rows, alive) if not ok}


def _draw(scores: torch.Tensor, batch: list[Sampler]) -> torch.Tensor:
    """Greedy rows' argmax; the others warped and drawn, each with its own generator."""
    tokens = torch.empty(len(batch), dtype=torch.long, device=scores.device)
    greedy = [r for r, s in enumerate(batch) if s.params.greedy]
    sampled = [r for r, s in enumerate(batch) if not s.params.greedy]
    if len(greedy) == len(batch):
        return scores.argmax(-1)
    if greedy:
        tokens[greedy] = scores[greedy].argmax(-1)
    if sampled:
        params = [batch[r].params for r in sampled]
        warped = scores[sampled] / torch.tensor([[p.temperature] for p in params], device=scores.device)
        warped = _top_k(warped, [p.top_k for p in params])
        warped = _top_p(warped, [p.top_p for p in params])
        warped = _min_p(warped, [p.min_p for p in params])
        probs = torch.softmax(warped, dim=-1)
        drawn = [torch.multinomial(probs[k], 1, generator=batch[r].generator) for k, r in enumerate(sampled)]
        tokens[sampled] = torch.cat(drawn)
    return tokens


def _top_k(scores: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Hugging Face's TopKLogitsWarper, each row with its own k (0: off)."""
    rows = [r for r, k in enumerate(ks) if k > 0]
    if not rows:
        return scores
    part = scores[rows]
    k = torch.tensor([min(ks[r], part.shape[-1]) for r in rows], device=scores.device)
    kth = part.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
    scores[rows] = part.masked_fill(part < kth, NEG_INF)
    return scores


def _top_p(scores: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """Hugging Face's TopPLogitsWarper, each row with its own p (1.0: off)."""
    rows = [r for r, p in enumerate(ps) if p < 1.0]
    if not rows:
        return scores
    part = scores[rows]
    sorted_logits, sorted_indices = torch.sort(part, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    # 1 - p in double, then float32: how Hugging Face's comparison with a Python float rounds it
    threshold = torch.tensor([[1 - ps[r]] for r in rows], device=scores.device, dtype=cumulative.dtype)
    remove = cumulative <= threshold
    remove[..., -1:] = 0  # keep at least one
    scores[rows] = part.masked_fill(remove.scatter(1, sorted_indices, remove), NEG_INF)
    return scores


def _min_p(scores: torch.Tensor, values: list[float]) -> torch.Tensor:
    """Hugging Face's MinPLogitsWarper, each row with its own min_p (0: off)."""
    rows = [r for r, v in enumerate(values) if v > 0.0]
    if not rows:
        return scores
    part = scores[rows]
    probs = torch.softmax(part, dim=-1)
    min_p = torch.tensor([[values[r]] for r in rows], device=scores.device, dtype=probs.dtype)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    remove.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)  # keep at least one
    scores[rows] = part.masked_fill(remove, NEG_INF)
    return scores


def _logprobs(raw: torch.Tensor, tokens: torch.Tensor, batch: list[Sampler]) -> dict[int, tuple[float, list]]:
    """{row: (the chosen token's logprob, its top alternatives)} for rows that asked, from the model's
    own scores before any penalty or warping (as vLLM reports them)."""
    rows = [r for r, s in enumerate(batch) if s.params.logprobs is not None]
    if not rows:
        return {}
    logprobs = torch.log_softmax(raw[rows].float(), dim=-1)
    chosen = logprobs.gather(1, tokens[rows][:, None])[:, 0].tolist()
    most = max(batch[r].params.logprobs for r in rows)
    values, indices = (torch.topk(logprobs, most) if most > 0 else (logprobs[:, :0], logprobs[:, :0].long()))
    values, indices = values.tolist(), indices.tolist()
    found = {}
    for k, r in enumerate(rows):
        n = batch[r].params.logprobs
        found[r] = (chosen[k], list(zip(indices[k][:n], values[k][:n])))
    return found
