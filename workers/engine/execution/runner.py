"""The model's forward passes for the engine: prefill newcomers, then one batched decode step.

A newcomer is prefilled alone, in chunks of at most `prefill_chunk` tokens per
engine step so running streams never stall for long (prefill.py); its cache then joins
the left-padded batch, and every running sequence advances by one token per step.
What the model caches (workers/engine/execution/kv/specs.py) decides the rest: recurrent
layers that restart on a multi-token chunk prefill whole (and continue a cached state
one token at a time); a recurrent state is never cut out of a padded prefill, and comes
from the prefix cache only as a checkpoint (kv/prefix_cache.py); a cache of a kind the
batch has no store for, or a model that misreads a padded row's positions, decodes row by row.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from protocol import failpoints
from workers.engine.models.adapters import adapter_names
from workers.engine.models.lora_batch import dense_lora
from workers.engine.execution.kv.budget import KVBudgetSetting
from workers.engine.execution.kv.prefix_cache import PrefixCache
from workers.engine.execution.kv.apart import least_saved_tokens, rows_apart
from workers.engine.execution.kv_room import KVRoom, cached_tokens
from workers.engine.execution.prefill import Prefill
from workers.engine.execution.prefix_reuse import PrefixReuse
from workers.engine.execution.kv.recompute import next_logits
from workers.engine.execution.kv.slab import SlabKV, static_attention
from workers.engine.execution.kv.specs import STATE, cache_spec
from workers.engine.models.model_loader import LoadedModel
from workers.engine.sequences import Sequence
from workers.engine.step_clock import StepClock
from workers.engine.execution.input_batch import InputBatch
from workers.engine.plan import DecodePlan, StepOutput
from workers.engine.sample.constraints import masks_for
from workers.engine.execution.mrope import takes_rope_offsets
from workers.engine.execution.static_decode import StaticDecode
from protocol.speculative import SpeculativeConfig
from workers.engine.speculation.proposers import proposer_for
from workers.engine.execution.attention_kernels import grouped_query_attention
from workers.engine.speculation.verify import verify

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerSettings:
    """What every model's runner is told (from the engine's config)."""

    prefill_chunk: int = 256
    prefix_cache_bytes: int = 0
    max_rows: int = 32
    static_decode: bool = False  # decode steps as one static program (workers/engine/execution/static_decode.py)
    cuda_graphs: bool = False  # ... captured into a CUDA graph per bucket of rows (on CUDA)
    speculative: SpeculativeConfig | None = None  # drafts verified in the decode step (workers/engine/speculation/)
    kv_budget: KVBudgetSetting = KVBudgetSetting()  # each model's KV cache budget (kv/budget.py)
    # a row decodes apart from the slab when that saves this much (kv/apart.py); None: 64 MiB on a CPU, a quarter
    # of the KV budget elsewhere (where a forward of its own costs about a whole step); negative: never
    rows_apart_least_bytes: int | None = None


class ModelRunner(KVRoom, PrefixReuse, Prefill):
    """One model's forwards (KV budget: kv_room.py; prefix reuse: prefix_reuse.py)."""

    remembers_answers = True  # a finished row's prompt and answer go to the prefix cache (`drop_finished`)
    keeps_rows_apart = True  # a row far longer than the others decodes apart from the slab (kv/apart.py)

    def __init__(self, loaded: LoadedModel, settings: RunnerSettings = RunnerSettings()) -> None:
        self.loaded = loaded
        self.prefill_chunk = max(1, settings.prefill_chunk)
        self.spec = spec = cache_spec(loaded.model, loaded.device)
        self.kv_budget = self._size_budget(settings.kv_budget)
        self.prefix_cache = (PrefixCache(loaded.model.config, min(settings.prefix_cache_bytes, self.kv_budget.bytes),
                                         checkpoints=spec.has(STATE))
                             if settings.prefix_cache_bytes > 0 and spec.reuses_prefixes else None)
        # CPU pages of row slots are only taken when written: reserve every row now and never regrow.
        row_slots = settings.max_rows if loaded.device.type == "cpu" else 4
        self.rope_offsets = takes_rope_offsets(loaded.model)  # M-RoPE: a rotary offset per row (execution/mrope.py)
        self.batch = SlabKV(loaded.model.config, spec, loaded.device, row_slots, self.rope_offsets)
        # LoRA rows pick their adapter per row, which a fixed program over a bucket cannot.
        self.static: StaticDecode | None = None
        if settings.static_decode and spec.batchable and loaded.peft is None and static_attention(loaded.model.config):
            self.batch.zeroed = True
            self.batch.dtype = loaded.model.dtype
            self.static = StaticDecode(self.batch, self._static_forward, loaded.model_id, settings.cuda_graphs)
        self.proposer = proposer_for(spec, loaded, settings.speculative, settings.max_rows)
        self.batch_rows: list[Sequence] = []  # row i of the batch cache belongs to batch_rows[i]
        self.solo_rows: list[Sequence] = []  # decoded one by one (a cache the batch has no store for, or apart)
        self.apart_least_tokens = (least_saved_tokens(settings.rows_apart_least_bytes, loaded.device, self.kv_budget)
                                   if self.keeps_rows_apart and spec.batchable and not self.rope_offsets
                                   and self.proposer is None else None)  # None: every row in the slab
        self._view: InputBatch | None = None  # the persistent batch's view of the rows, until they change
        declined = [what for what, served in (("decoding in one batch", spec.batchable),
                                              ("prefix reuse", spec.reuses_prefixes),
                                              ("padded prefills of several prompts", spec.prefills_padded),
                                              ("chunked prefill", spec.continues_chunks)) if not served]
        logger.info("%s: cache of %s%s%s", loaded.model_id, spec.describe(),
                    f"; without {', '.join(declined)}" if declined else "",
                    f" ({'; '.join(spec.notes)})" if spec.notes else "")

    def _forward(self, rows: list[Sequence], **inputs):
        """The model's forward over `rows`, adding each row's LoRA adapter's term where a row has one
        (workers/engine/models/lora_batch.py; peft's mixed forward for variants it does not serve), so adapters
        and the base share the batch."""
        failpoints.hit("engine.forward")
        names = adapter_names(rows) if self.loaded.peft is not None else None
        if names is None:
            return self.loaded.model(**inputs)
        stacked = dense_lora(self.loaded.peft)
        if stacked.serves():
            with stacked.rows(names):
                return self.loaded.model(**inputs)
        return self.loaded.peft(**inputs, adapter_names=names)

    def _static_forward(self, **inputs) -> torch.Tensor:
        return self.loaded.model(**inputs, use_cache=True, logits_to_keep=1).logits[:, -1]

    def kv_bytes(self, tokens: int) -> int:
        """Cache bytes of one sequence of `tokens` tokens, over every layer of its kind."""
        return self.spec.bytes_for(tokens)

    def _cache_inputs(self, cache, positions: range | None = None) -> dict:
        """The forward's cache argument and, where the model takes them, explicit positions (models such
        as Bamba count from 0 at every call without them)."""
        inputs = {self.spec.cache_arg: cache}
        if positions is not None and self.spec.takes_positions:
            inputs["position_ids"] = torch.tensor([list(positions)], device=self.loaded.device)
        return inputs

    def _cache_of(self, output):
        cache = getattr(output, self.spec.cache_arg, None)
        return cache if cache is not None else output.past_key_values

    @property
    def running(self) -> int:
        return len(self.batch_rows) + len(self.solo_rows)

    @property
    def rows(self) -> list[Sequence]:
        return [*self.batch_rows, *self.solo_rows]

    def view(self) -> InputBatch:
        """The running rows as a step reads them, rebuilt only after rows joined, paused or left."""
        if self._view is None:
            self._view = InputBatch(self.rows, self.loaded.device)
        return self._view

    # --- prefill -----------------------------------------------------------
    def join(self, sequences: list[Sequence]) -> None:
        """Prefilled sequences start decoding with the running batch from the next forward."""
        if not sequences:
            return
        self._view = None
        if not self.spec.batchable:
            self.solo_rows.extend(sequences)
            return
        sequences = self._set_apart(sequences)
        if not sequences:
            return
        self.batch.add([seq.state for seq in sequences], [cached_tokens(seq) for seq in sequences],
                       [seq.rope_offset for seq in sequences] if self.rope_offsets else None)
        for seq in sequences:
            seq.state = None  # its keys/values now live in the batch
        self.batch_rows.extend(sequences)
        self.make_room()  # the prefix cache gives way to the rows that joined

    def _set_apart(self, joining: list[Sequence]) -> list[Sequence]:
        """Rows far longer than the rest (kv/apart.py), newcomers or rows of the slab, go to the rows decoded
        apart (a row of the slab with a copy of its cache); the newcomers that join the slab are returned."""
        if self.apart_least_tokens is None:
            return joining
        members = [*self.batch_rows, *joining]
        apart = rows_apart([cached_tokens(seq) for seq in members], len(self.solo_rows), self.apart_least_tokens)
        if not apart:
            return joining
        leaving = [i for i in apart if i < len(self.batch_rows)]
        for row in leaving:
            self.batch_rows[row].state = self.batch.row_cache(row)
        if leaving:
            self.batch_rows = [self.batch_rows[i] for i in self.batch.remove(leaving)]
        self.solo_rows.extend(members[i] for i in sorted(apart))
        going = {id(members[i]) for i in apart}
        logger.info("%s: %d row(s) of %s tokens decode apart from the slab (%d rows there, the longest %d tokens)",
                    self.loaded.model_id, len(apart), "/".join(str(cached_tokens(members[i])) for i in apart),
                    len(members) - len(apart), max((cached_tokens(seq) for seq in members if id(seq) not in going),
                                                   default=0))
        return [seq for seq in joining if id(seq) not in going]

    def rejoin(self, seq: Sequence) -> None:
        """A preempted row, prefilled again (its prompt and what it drew): it decodes on from its last token."""
        self.remember_prefix(seq)
        seq.recomputes = False
        self.join([seq])

    def pause(self, sequences: list[Sequence]) -> None:
        """Take running sequences out of the batch, each keeping its keys/values (`seq.state`) to rejoin
        later exactly where it stopped (`join`): preemption by the scheduler, nothing recomputed."""
        leaving = {id(seq) for seq in sequences}
        self._view = None
        rows = [i for i, seq in enumerate(self.batch_rows) if id(seq) in leaving]
        for row in rows:
            self.batch_rows[row].state = self.batch.row_cache(row)
        if rows:
            self.batch_rows = [self.batch_rows[i] for i in self.batch.remove(rows)]
        self.solo_rows = [seq for seq in self.solo_rows if id(seq) not in leaving]  # solo rows keep their state

    # --- decode ------------------------------------------------------------
    def _check_prepared_mask(self, last_tokens: list[int]):
        """The first padded decode step runs twice: with the slab's 4D mask, then with the 2D mask that
        transformers turns into its own (whose output the step keeps, and whose keys/values overwrite the
        trial's in the same column). Later steps hand the model the 4D mask only if both gave the same
        logits: a model that reads the 2D mask for more than attention (ALiBi biases, positions) does not."""
        try:
            trial = self._forward(self.batch_rows, **self.batch.decode_inputs(last_tokens, prepared_mask=True),
                                  use_cache=True, logits_to_keep=1).logits
            why_not = "it gave other logits"
        except Exception as exc:  # e.g. a model that builds ALiBi biases from the 2D mask
            trial, why_not = None, f"it failed: {exc}"
        output = self._forward(self.batch_rows, **self.batch.decode_inputs(last_tokens, prepared_mask=False),
                               use_cache=True, logits_to_keep=1)
        self.batch.prepared_mask = trial is not None and torch.equal(trial, output.logits)
        logger.info("%s: padded decode steps %s", self.loaded.model_id, "hand SDPA its 4D mask" if self.batch.prepared_mask
                    else f"keep the 2D mask (the 4D one: {why_not})")
        return output

    def abandon(self) -> list[Sequence]:
        """Forget every running row (after a failed step, whose writes to the batch may be half done);
        returns them, for their requests to fail."""
        rows = self.rows
        self.batch_rows, self.solo_rows, self._view = [], [], None
        self.batch.clear()
        return rows

    def _decode_over_window(self, last_tokens: list[int], clock: StepClock | None = None) -> torch.Tensor:
        """One decode step over the batch's window (its shapes change every step); logits [rows, vocab]."""
        if self.batch.prepared_mask is None and self.batch.padded:
            output = self._check_prepared_mask(last_tokens)
        else:
            inputs = self.batch.decode_inputs(last_tokens)
            if clock is not None:
                clock.lap("prepare")
            output = self._forward(self.batch_rows, **inputs, use_cache=True, logits_to_keep=1)  # writes the slab in place
        return output.logits[:, -1, :]

    def drop_finished(self) -> None:
        dead = [i for i, seq in enumerate(self.batch_rows) if seq.finished]
        if dead:
            self._remember_answers(dead)
            self.batch_rows = [self.batch_rows[i] for i in self.batch.remove(dead)]
            self._view = None
        if self.solo_rows and any(seq.finished for seq in self.solo_rows):
            self.solo_rows = [seq for seq in self.solo_rows if not seq.finished]
            self._view = None

    def _last_tokens(self, rows: InputBatch) -> torch.Tensor | list[int]:
        """The batch rows' last tokens: the previous step's drawn tensor while the rows are the same (no
        copy to the device), else read off the sequences."""
        drawn = rows.sampling.drawn
        if drawn is not None:
            return drawn[:len(self.batch_rows)]
        return [seq.completion_ids[-1] for seq in self.batch_rows]

    def execute(self, plan: DecodePlan) -> StepOutput:
        """Run a decode plan: one forward over its rows, one batched sample; the tokens chosen come back."""
        if plan.rows is not self._view:
            raise ValueError("a decode plan for rows this runner does not hold")
        if self.proposer is not None and self.batch_rows:
            proposals = self.proposer.propose(self.batch_rows, plan.waiting)
            if plan.clock is not None:
                plan.clock.lap("propose")
            if proposals:
                return self._verify_step(plan.rows, proposals, plan.clock)
        rows, logits = self.decode(plan.clock)
        return sample_batch(rows, logits)

    def _verify_step(self, rows: InputBatch, proposals: dict[int, list[int]], clock: StepClock | None) -> StepOutput:
        """One forward that feeds every row its last token and its drafts (rows without any: padding, which
        they drop), the batch's first tokens picked as any step picks them, each proposing row's accepted
        run after them (workers/engine/speculation/verify.py); the cache keeps what each row accepted."""
        width = 1 + max(len(drafts) for drafts in proposals.values())
        ids = []
        for i, seq in enumerate(self.batch_rows):
            last, drafts = seq.completion_ids[-1], proposals.get(i, ())
            ids.append([last, *drafts] + [last] * (width - 1 - len(drafts)))
        ids = torch.tensor(ids, device=self.loaded.device)
        states = self.batch.snapshot_states(self.batch.rows) if self.spec.has(STATE) else None  # one row (proposers.py)
        inputs = self.batch.verify_inputs(ids)
        if clock is not None:
            clock.lap("prepare")
        with grouped_query_attention(self.loaded.device):
            logits = self._forward(self.batch_rows, **inputs, use_cache=True, logits_to_keep=width).logits
        if clock is not None:
            clock.lap("forward")
        output = sample_batch(rows, logits[:, 0])
        kept = verify(output, logits, proposals)
        if states is not None and kept[0] < width:  # the recurrent states took every draft: again, with the kept
            self.batch.restore_states(states)
            self.batch.mask[:, self.batch.end + kept[0]:self.batch.end + width] = False
            self._forward(self.batch_rows, **self.batch.verify_inputs(ids[:, :kept[0]]), use_cache=True,
                          logits_to_keep=1)
        self.batch.commit(kept, width)
        self.proposer.verified(self.batch_rows, proposals, kept)
        return output

    def decode(self, clock: StepClock | None = None) -> tuple[InputBatch, torch.Tensor | None]:
        """One token's scores for every running sequence: (the rows, their [rows, vocab] logits); `clock`
        counts the time of its inputs (`prepare`) and of the model (`forward`)."""
        rows = self.view()
        logits: list[torch.Tensor] = []
        if self.batch_rows:
            if self.static is not None and self.static.serves(len(self.batch_rows)):
                last_tokens = [seq.completion_ids[-1] for seq in self.batch_rows]
                logits.append(self.static.step(last_tokens, lambda: self._decode_over_window(last_tokens)))
            else:
                logits.append(self._decode_over_window(self._last_tokens(rows), clock))
            self.batch.advance()
        for seq in self.solo_rows:
            if self.spec.recomputes:
                logits.append(next_logits(self._forward, self.loaded, seq))
                continue
            position = cached_tokens(seq)
            output = self._forward(
                [seq], input_ids=torch.tensor([seq.completion_ids[-1:]], device=self.loaded.device),
                use_cache=True, logits_to_keep=1, **self._cache_inputs(seq.state, range(position, position + 1)),
            )
            seq.state = self._cache_of(output)
            logits.append(output.logits[:, -1, :])
        if clock is not None:
            clock.lap("forward")
        if not logits:
            return rows, None
        return rows, logits[0] if len(logits) == 1 else torch.cat(logits)


def sample_batch(batch: InputBatch, logits: torch.Tensor) -> StepOutput:
    """Every row's next token from its row of `logits` ([rows, vocab]): the constrained rows' grammar masks
    filled together, then every choice made in one batched pass (the batch's sampling columns,
    workers/engine/sample/batch_sampling.py)."""
    rows = batch.rows
    masks = (masks_for([seq.constraint for seq in rows], logits.shape[-1]) if batch.constrained
             else batch.no_masks)
    ids, logprobs, alone = batch.sampling.pick(logits, batch.generated() or [], batch.history, masks)
    return StepOutput(batch, ids, logprobs, alone)
