"""Verifying drafts inside the batched step: every row's first token as any step picks it, then each
proposing row's drafts checked against the target's own choice at each position.

Row i fed [last, d1..dk]; its logits at position j are the model's next-token scores after d1..dj. Its
first token t0 is picked at position 0 with the whole batch (`sample_batch`, so non-proposing rows are
exactly an ordinary step); a proposing row (rows.may_speculate) then picks t1.. at positions 1..k through the
same sampling columns (its own warpers and generator, EOS held off before min_tokens, logprobs), and keeps
d1..dj and t0..tj for the longest j with dm == t(m-1) for every m <= j.

Position j is scored as if d1..dj had been taken (they were, if it counts): repetition, presence and
frequency penalties see the history with d1..dj (a logit bias is the same everywhere), and a grammar row's
mask is its grammar's after consuming d1..dj (`draft_masks`: the matcher advanced, each mask computed, then
rolled back). A draft the grammar refuses ends the row's drafts there, unfed to the matcher (the target's
token before it, masked, could never equal it); a draft that ends the choice (a stop id, EOS, the grammar
complete) is the last checked. The kept tokens are then taken one by one (`StepOutput.apply`), so the
matcher stands after exactly those, and the batch's kept penalty tensors, which took t0 with the batch, take
the rest of the run (`SamplingColumns.took_more`).

Greedy rows: exactly what one-token steps write. Sampled rows: this is rejection sampling (vLLM's scheme,
Leviathan et al.) for a proposer whose draft distribution q is one token (n-gram lookup): the draft d is
accepted with probability min(1, p(d) / q(d)) = p(d), which is the chance that a token drawn from p is d;
on a rejection the residual (p - q)+ normalised is p without d, which is what the drawn token then is. So
every kept token is distributed exactly as one-token steps' tokens; a seeded request repeats alone or in any
batch, but its draws differ from a run without speculation (rejected positions use draws too).
"""
from __future__ import annotations

import torch

from workers.engine.plan import StepOutput
from workers.engine.sample.batch_sampling import SamplingColumns
from workers.engine.sample.constraints import allowed_tokens


def verify(output: StepOutput, logits: torch.Tensor, proposals: dict[int, list[int]]) -> list[int]:
    """Adds each proposing row's accepted run to `output.extra` (`output`: the step's first tokens, picked from
    `logits[:, 0]`); returns by row the columns of the step each row keeps in its cache (its last token and
    its accepted drafts)."""
    batch = output.rows
    sampling = batch.sampling
    sampling.drawn = None  # the next step's inputs are not these tokens: read them off the sequences
    kept = [1] * len(batch)
    vocab = logits.shape[-1]
    checked: dict[int, list[int]] = {}
    samplers, generated, index_rows, index_positions, masks, places = [], [], [], [], [], []
    for i in sorted(proposals):
        seq = batch.rows[i]
        drafts = proposals[i]
        if seq.constraint is not None:
            allowed = draft_masks(seq, drafts, vocab)
            drafts = drafts[:len(allowed)]  # the first draft the grammar refuses could never be kept
        else:
            allowed = [None] * len(drafts)
        checked[i] = drafts
        count = len(drafts)
        samplers += [seq.sampler] * count
        generated += [len(seq.completion_ids) + j for j in range(1, count + 1)]
        index_rows += [i] * count
        index_positions += range(1, count + 1)
        masks += allowed
        places += [(seq, drafts, j) for j in range(1, count + 1)]
    if not index_rows:
        return kept

    def history(k: int) -> tuple[list[int], list[int]]:  # read only for penalised rows
        seq, drafts, j = places[k]
        return seq.prompt_ids, seq.completion_ids + drafts[:j]

    later = logits[torch.tensor(index_rows), torch.tensor(index_positions)]
    columns = SamplingColumns(samplers, logits.device)
    ids, logprobs, _ = columns.pick(later, generated, history, masks)
    at = 0
    for i, drafts in checked.items():
        target = output.token_ids[i]
        run = []
        for j, draft in enumerate(drafts):
            if draft != target:
                break
            target = ids[at + j]
            logprob, top = logprobs.get(at + j, (None, ()))
            run.append((target, logprob, top))
        at += len(drafts)
        kept[i] = 1 + len(run)
        if run:
            output.extra[i] = run
            if sampling.penalties.active:  # the batch's penalty tensors took the first token: the run too
                sampling.took_more(i, [token for token, _, _ in run if token is not None])
    return kept


def draft_masks(seq, drafts: list[int], vocab: int) -> list[torch.Tensor | None]:
    """A constrained row's grammar masks at draft positions 1.. (after d1..dj, as if taken), for its drafts up to
    the first the grammar refuses (that one and those after it get none: they are cut). A draft that ends the
    choice (a stop id, EOS, the grammar complete) is the last, with no mask after it (nothing after it is taken).
    The matcher is rolled back to where it stood: the sequence consumes what it keeps when it takes it."""
    constraint = seq.constraint
    matcher = constraint.matcher
    masks: list[torch.Tensor | None] = []
    consumed = 0
    try:
        for draft in drafts:
            if draft in seq.end_ids:
                masks.append(None)
                break
            if matcher.is_stopped() or matcher.validate_tokens([draft]) != 1 or not matcher.consume_token(draft):
                break
            consumed += 1
            if matcher.is_error():
                break
            if matcher.is_stopped():
                masks.append(None)
                break
            masks.append(allowed_tokens([constraint], vocab)[0])
    finally:
        if consumed:
            matcher.rollback(consumed)
    return masks
