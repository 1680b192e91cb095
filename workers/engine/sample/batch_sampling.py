"""One step's tokens for many rows at once: tensor operations over the batch, one copy to the host.

Per row, a choice is exactly what `Sampler.choose` would make of that row alone: the same float
operations in the same order (temperature, then Hugging Face's top-k, top-p and min-p, as its
warpers compute them, with each row's own value), the same per-request generator for the draw.
Repetition, presence and frequency penalties and a logit bias are batched too, in tensors kept across
steps (workers/engine/sample/penalties.py). Rows with n-gram bans, bad words, an allowed-token set or
typical-p go through `Sampler.choose` one by one; every other row (greedy or temperature/top-k/top-p/
min-p, penalties, EOS held off, grammar masks, logprobs) costs a handful of batched operations and one
`.tolist()` per step.
"""
from __future__ import annotations

import numpy
import torch

from workers.engine.sample.penalties import BatchPenalties
from workers.engine.sample.sampling import Sampler, TokenChoice, reported

NEG_INF = -float("inf")


class SamplingColumns:
    """The batch's sampling settings by row, worked out once while the rows stay the same (the persistent
    batch's sampling columns): which rows go one by one, which are greedy, their temperatures and
    warpers' values, who asked for logprobs, whose EOS is held off. A step then costs a handful of tensor
    operations and no Python loop over the rows."""

    def __init__(self, samplers: list[Sampler], device: torch.device | None = None) -> None:
        self.samplers = samplers
        self.size = len(samplers)
        self.one_by_one = [i for i, s in enumerate(samplers) if not s.batchable]
        rows = self.rows = [i for i, s in enumerate(samplers) if s.batchable]
        self.every = len(rows) == len(samplers)
        batch = self.batch = [samplers[i] for i in rows]
        self.greedy = [r for r, s in enumerate(batch) if s.params.greedy]
        self.sampled = [r for r, s in enumerate(batch) if not s.params.greedy]
        params = [batch[r].params for r in self.sampled]
        self.temperatures = (torch.tensor([[p.temperature] for p in params], device=device) if params else None)
        self.top_ks = [p.top_k for p in params]
        self.top_ps = [p.top_p for p in params]
        self.min_ps = [p.min_p for p in params]
        self.generators = [batch[r].generator for r in self.sampled]
        self.logprob_rows = [r for r, s in enumerate(batch) if s.params.logprobs is not None]
        self.logprob_counts = [batch[r].params.logprobs for r in self.logprob_rows]
        held = [r for r, s in enumerate(batch) if s.eos_token_ids and (s.params.ignore_eos or s.params.min_tokens)]
        self.eos_always = [r for r in held if batch[r].params.ignore_eos]  # held off at every step
        self.eos_until = [(r, batch[r].params.min_tokens) for r in held if not batch[r].params.ignore_eos]
        self.eos_ids = [batch[r].eos_token_ids for r in held]
        self.eos_shared = bool(held) and all(ids == self.eos_ids[0] for ids in self.eos_ids)
        self.drawn: torch.Tensor | None = None  # the last step's tokens, every row's (the next step's input ids)
        self.penalties = BatchPenalties(batch)  # repetition, presence, frequency, logit bias: kept across steps

    def pick(self, logits: torch.Tensor, generated: list[int], histories, allowed: list[torch.Tensor | None]
             ) -> tuple[list[int | None], dict[int, tuple[float, list]], dict[int, TokenChoice | None]]:
        """Row i's next token from `logits[i]`: (ids by row, None at a grammar's dead end; {row: (logprob,
        top)} for rows that asked; {row: the choice} for rows sampled one by one). `generated[i]` is the
        row's completion length (EOS held off before min_tokens); `histories(i)` its (prompt ids,
        completion ids), read only for rows sampled one by one; `allowed[i]` its grammar mask or None."""
        ids: list[int | None] = [None] * self.size
        alone = {i: self.samplers[i].choose(logits[i], *histories(i), allowed[i]) for i in self.one_by_one}
        for i, choice in alone.items():
            ids[i] = None if choice is None else choice.token_id
        if not self.rows:
            return ids, {}, alone
        rows = self.rows
        raw = logits if self.every else logits[rows]
        scores = raw.float()
        if self.logprob_rows and scores.data_ptr() == raw.data_ptr():
            scores = scores.clone()  # logprobs are the model's own scores: penalties, EOS and grammars on a copy
        if self.penalties.active:  # else in place: the step's logits are its own, read only here
            self.penalties.apply(scores, lambda r: histories(rows[r]))
        self._hold_off_eos(scores, generated)
        dead = _apply_grammars(scores, [allowed[i] for i in rows] if not self.every else allowed)
        tokens = self._draw(scores)
        if self.penalties.active:
            self.penalties.took(tokens)
        picked = self._logprobs(raw, tokens)
        drawn = tokens.tolist()
        self.drawn = tokens if self.every and not dead else None
        if self.every and not dead:
            ids = drawn
        else:
            for position, i in enumerate(rows):
                if position not in dead:
                    ids[i] = drawn[position]
        logprobs = picked if self.every else {rows[position]: value for position, value in picked.items()}
        return ids, logprobs, alone

    def took_more(self, row: int, tokens: list[int]) -> None:
        """Batch row `row` took `tokens` after this step's first token (a verified run of drafts,
        workers/engine/speculation/verify.py): the kept penalty tensors count them too."""
        if self.penalties.active and self.samplers[row].batchable:
            self.penalties.took_more(self.rows.index(row), tokens)

    def choose(self, logits: torch.Tensor, histories: list[tuple[list[int], list[int]]],
               allowed: list[torch.Tensor | None]) -> list[TokenChoice | None]:
        """`pick`, as one TokenChoice per row (None for a grammar dead end)."""
        ids, logprobs, alone = self.pick(logits, [len(h[1]) for h in histories], histories.__getitem__, allowed)
        choices: list[TokenChoice | None] = []
        for i, token_id in enumerate(ids):
            if i in alone:
                choices.append(alone[i])
            elif token_id is None:
                choices.append(None)
            else:
                logprob, top = logprobs.get(i, (None, []))
                choices.append(TokenChoice(token_id, logprob, top))
        return choices

    def _hold_off_eos(self, scores: torch.Tensor, generated: list[int]) -> None:
        """EOS can't come while `ignore_eos`, nor before `min_tokens`."""
        rows = self.eos_always + [r for r, least in self.eos_until if generated[self.rows[r]] < least]
        if not rows:
            return
        if self.eos_shared:
            eos = self.eos_ids[0]
            if len(rows) == len(self.batch):  # every row (ignore_eos in a whole batch): columns, no index tensors
                scores[:, eos] = NEG_INF
            else:
                scores[torch.tensor(rows)[:, None], torch.tensor(eos)[None, :]] = NEG_INF
        else:
            for r in rows:
                scores[r, self.batch[r].eos_token_ids] = NEG_INF

    def _draw(self, scores: torch.Tensor) -> torch.Tensor:
        """Greedy rows' argmax; the others warped and drawn, each with its own generator."""
        if not self.sampled:
            return argmax_rows(scores)
        greedy, sampled = self.greedy, self.sampled
        tokens = torch.empty(len(self.batch), dtype=torch.long, device=scores.device)
        if greedy:
            tokens[greedy] = argmax_rows(scores[greedy])
        warped = scores[sampled] / self.temperatures.to(scores.device)
        warped = _top_k(warped, self.top_ks)
        warped = _top_p(warped, self.top_ps)
        warped = _min_p(warped, self.min_ps)
        probs = torch.softmax(warped, dim=-1)
        drawn = [torch.multinomial(probs[k], 1, generator=generator) for k, generator in enumerate(self.generators)]
        tokens[sampled] = torch.cat(drawn)
        return tokens

    def _logprobs(self, raw: torch.Tensor, tokens: torch.Tensor) -> dict[int, tuple[float, list]]:
        """{row: (the chosen token's logprob, its top alternatives)} for rows that asked, from the model's
        own scores before any penalty or warping (as vLLM reports them)."""
        rows = self.logprob_rows
        if not rows:
            return {}
        logprobs = torch.log_softmax(raw[rows].float(), dim=-1)
        chosen = reported(logprobs.gather(1, tokens[rows][:, None])[:, 0]).tolist()
        most = max(self.logprob_counts)
        values, indices = (torch.topk(logprobs, most) if most > 0 else (logprobs[:, :0], logprobs[:, :0].long()))
        values, indices = reported(values).tolist(), indices.tolist()
        return {r: (chosen[k], list(zip(indices[k][:n], values[k][:n])))
                for k, (r, n) in enumerate(zip(rows, self.logprob_counts))}


def argmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """Each row's first highest score, as `torch.argmax` picks it; on the CPU through numpy, whose argmax is
    5-8x faster than torch's CPU kernel here (64 rows x 1k-150k vocabulary) and picks the same index."""
    if scores.device.type == "cpu" and scores.dtype == torch.float32:
        return torch.from_numpy(numpy.argmax(scores.detach().numpy(), axis=-1))
    return scores.argmax(-1)


def choose_batch(samplers: list[Sampler], logits: torch.Tensor, histories: list[tuple[list[int], list[int]]],
                 allowed: list[torch.Tensor | None]) -> list[TokenChoice | None]:
    """Row i's next token from `logits[i]` (the model's scores) under `samplers[i]`; `histories[i]` is
    (prompt ids, completion ids); `allowed[i]` its grammar mask or None. None for a grammar dead end."""
    return SamplingColumns(samplers, logits.device).choose(logits, histories, allowed)


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
