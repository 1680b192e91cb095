"""Where each sequence is and what one engine step computes for it: waiting, prefilling, decoding.

Sequences wait in their team's line until the fair queue (workers/engine/core/fair_share.py) lets them
in, a slot is free and their keys/values fit their model's KV budget (workers/engine/execution/kv/budget.py)
beside what the model's rows hold now; rows a waiting sequence is owed are paused first (keys/values
kept, nothing recomputed). When the running rows' next steps would outgrow the budget, the prefix
cache gives way, then the lowest-priority, newest rows are preempted as vLLM does: their keys/values
dropped, each prefilled again later (its prompt and what it drew) and decoding on from there. The
step decodes one token for every running row of every model's batch, then prefills newcomers within
the pacer's token budget (workers/engine/core/prefill_pacing.py). A paused row's keys/values are
outside the KV budget's count while it waits.
Plain Python + torch: the engine owns requests and publishing, this owns the batch.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import torch

from workers.engine.config import EngineConfig
from workers.engine.execution.input_batch import InputBatch
from workers.engine.execution.kv.budget import HEADROOM_TOKENS
from workers.engine.execution.runner import sample_batch
from workers.engine.plan import DecodePlan, PrefillWork, StepOutput
from workers.engine.core.fair_share import FairQueue
from workers.engine.core.metrics import EngineMetrics
from workers.engine.core.prefill_pacing import PrefillPacer
from workers.engine.execution.runner import ModelRunner
from workers.engine.parallel.mirrored_runner import MirroredRunner
from workers.engine.sequences import Sequence
from workers.engine.step_clock import StepClock


logger = logging.getLogger(__name__)
Result = TypeVar("Result")
FAILED = object()  # what `Scheduler._attempt` returns when the work raised

CACHED_START_PADDING = 64  # tokens of padding a cached start may take to prefill with longer ones
CACHED_TOKENS_PER_FORWARD = 8192  # rows x longest cached start in one prefill forward


class Scheduler:
    def __init__(self, runners: dict[str, ModelRunner], metrics: EngineMetrics, config: EngineConfig) -> None:
        self.runners = runners  # by model key, shared with (and filled by) the model manager
        self.metrics = metrics
        self.max_num_seqs = config.max_num_seqs
        limit = config.batch_rows_beside_interactive  # < 0: not fitted to a device (EngineConfig.fitted): no limit
        self.batch_rows_beside_interactive = config.max_num_seqs if limit < 0 else min(limit, config.max_num_seqs)
        self.waiting = FairQueue()  # by team and class: who starts next (workers/engine/core/fair_share.py)
        self.prefilling: list[Sequence] = []
        self.pacer = PrefillPacer(config.prefill_chunk, config.prefill_share)
        self._budget_left: int | None = None  # prompt tokens left for this step after the first prefill
        # Sequences whose forward (or sampling) raised, with why: the engine fails their requests alone.
        self.failures: list[tuple[Sequence, Exception]] = []
        self.clock = StepClock()  # where each step's time goes (workers/engine/step_clock.py)

    def take_failures(self) -> list[tuple[Sequence, Exception]]:
        failures, self.failures = self.failures, []
        return failures

    def _attempt(self, sequences: list[Sequence], work: Callable[[], Result], runner: ModelRunner | None = None,
                 ) -> Result | object:
        """`work` for these sequences; if it raises, they fail alone (with `runner`: every row of its batch,
        whose cache the failed step may have half written) and the step goes on for every other model."""
        try:
            return work()
        except Exception as exc:
            failed = list(sequences)
            if runner is not None:
                failed += [seq for seq in runner.abandon() if seq not in failed]
            logger.exception("a forward of %s failed for %d sequence(s); those requests fail, the others go on",
                             failed[0].request.model_name if failed else "?", len(failed))
            for seq in failed:
                seq.state = None
                self.failures.append((seq, exc))
            self.prefilling = [seq for seq in self.prefilling if seq not in failed]
            return FAILED

    def enqueue(self, sequences: list[Sequence]) -> None:
        """New sequences wait in their team's line."""
        self.waiting.extend(sequences, running=self.in_flight())

    def admit(self) -> None:
        """A step's start: drop finished rows, pause the rows waiting sequences are owed, let waiting
        sequences in."""
        for runner in self.runners.values():
            runner.drop_finished()
        self._fit_budgets()
        self._budget_left = None
        if not self.waiting:  # nobody to let in, so no row to pause (a paused row waits in the queue too)
            self.prefilling = [seq for seq in self.prefilling if not seq.finished]
            return
        self._let_waiting_in(passed_over=self._preempt())

    def decoding(self) -> bool:
        """Whether rows will decode this step (streams wait on it)."""
        return any(runner.running for runner in self.runners.values())

    def decode(self) -> int:
        """Give every running sequence its next token (after `admit`); how many rows decoded."""
        decoded = 0
        started = time.perf_counter()
        for model, runner in self.runners.items():
            waiting = bool(self.waiting) or any(not seq.finished for seq in self.prefilling)
            output = self._attempt([], lambda runner=runner: _decode_and_sample(runner, self.clock, waiting), runner)
            if output is not FAILED and output is not None:
                rows = output.rows
                decoded += len(rows)
                self.waiting.charge_teams(rows.teams)
                for i, run in output.extra.items():  # a verifying step's accepted runs: tokens served too
                    self.waiting.charge(rows.rows[i], generated=len(run))
            if runner.proposer is not None and runner.proposer.drafts:
                self.metrics.speculated(model, *runner.proposer.take_counts())
            if isinstance(runner, MirroredRunner):
                self.metrics.tensor_parallel_sent(model, *runner.take_sent())
        self.metrics.step(decoded)
        if decoded:
            self.pacer.decoded(time.perf_counter() - started)
        return decoded

    def _preempt(self) -> set[tuple[str, str]]:
        """Pause the running rows that waiting sequences are owed (batch rows for interactive newcomers,
        an over-share team's rows for an under-share team); each keeps its keys/values and waits at
        the front of its team's line. Returned: the lines ((class, team)) that gave rows up, whose rows must
        not take the freed slots straight back (their counter may be the lower one), or a row would pause
        and rejoin every step."""
        self.prefilling = [seq for seq in self.prefilling if not seq.finished]
        decoding = [seq for runner in self.runners.values() for seq in runner.rows if not seq.finished]
        victims = [seq for seq in self.waiting.to_preempt([*self.prefilling, *decoding], self.max_num_seqs)
                   if seq in decoding]
        if self._batch_limited():  # batch rows beyond the limit give way while interactive work is here
            batch_rows = [seq for seq in decoding if seq.priority_class == "batch" and seq not in victims]
            excess = len(batch_rows) - self.batch_rows_beside_interactive
            if excess > 0:
                victims.extend(batch_rows[-excess:])
        for name, runner in self.runners.items():
            mine = [seq for seq in victims if seq.request.model_name == name]
            runner.pause(mine)
            for seq in mine:
                seq.paused = True
                self.waiting.put_back(seq)
                self.metrics.preempted(seq)
        return {(seq.priority_class, seq.team) for seq in victims}

    def _fit_budgets(self) -> None:
        """Room in each model's KV budget for its running rows' next HEADROOM_TOKENS steps: the prefix cache
        gives way first, then rows are preempted by recompute, the lowest-priority and newest first, while
        more than one row runs."""
        for runner in self.runners.values():
            prefilling = self._prefilling_bytes(runner)
            if not runner.running or runner.make_room(runner.kv_projected(steps=HEADROOM_TOKENS) + prefilling):
                continue
            rows = sorted((seq for seq in runner.rows if not seq.finished and runner.preemptible(seq)),
                          key=lambda seq: (seq.priority_class == "interactive", seq.request.arrived), reverse=True)
            victims: list[Sequence] = []
            while rows and runner.running - len(victims) > 1 and not runner.make_room(
                    runner.kv_projected(steps=HEADROOM_TOKENS, leaving=victims) + prefilling):
                victims.append(rows.pop())
            if victims:
                runner.preempt(victims)
                for seq in victims:
                    self.waiting.put_back(seq)
                    self.metrics.kv_preempted(seq.request.model_name)
                logger.info("%s: %d row(s) preempted to keep within the KV cache budget; they prefill again "
                            "when there is room", victims[0].request.model_name, len(victims))

    def _prefilling_bytes(self, runner: ModelRunner) -> int:
        """Bytes of the caches the model's prompts under way hold outside its batch."""
        return sum(runner.kv_bytes(seq.prefilled) for seq in self.prefilling
                   if seq.state is not None and self.runners.get(seq.request.model_name) is runner)

    def _let_waiting_in(self, passed_over: set[tuple[str, str]]) -> None:
        """Whoever the fair queue says goes next (not the lines in `passed_over`), while a sequence slot is
        free and its keys/values fit its model's KV budget beside what the model holds (alone, it always
        runs: its context fits the budget); a paused sequence rejoins the batch at once (its keys/values kept)."""
        self.prefilling = [seq for seq in self.prefilling if not seq.finished]
        running = sum(runner.running for runner in self.runners.values()) + len(self.prefilling)
        joining: dict[str, list[int]] = {}  # the lengths of the prompts let in this pass, by model
        limited = self._batch_limited()
        batch_held = sum(1 for seq in self.in_flight() if seq.priority_class == "batch") if limited else 0
        held = Counter(seq.team for seq in self.in_flight())
        while running < self.max_num_seqs and (seq := self.waiting.peek(held, passed_over)) is not None:
            if limited and seq.priority_class == "batch":
                if batch_held >= self.batch_rows_beside_interactive:
                    break  # batch work waits for interactive work to leave (interactive ones come first)
                batch_held += 1
            runner = self.runners.get(seq.request.model_name)
            if runner is not None and not seq.paused:
                lengths = [*joining.get(seq.request.model_name, ()), len(seq.prefill_ids)]
                alone = not runner.running and len(lengths) == 1 and not self._prefilling_bytes(runner)
                if not alone and not runner.make_room(runner.kv_projected(lengths, HEADROOM_TOKENS)
                                                      + self._prefilling_bytes(runner)):
                    break  # it waits for rows of its model to finish
                joining[seq.request.model_name] = lengths
            self.waiting.pop(held, passed_over)
            held[seq.team] += 1
            if seq.paused:
                seq.paused = False
                self.runners[seq.request.model_name].join([seq])
            else:
                self.prefilling.append(seq)
                if not seq.recomputes:  # a preempted row was charged and counted when it first came in
                    self.waiting.charge(seq, prompt_tokens=len(seq.prompt_ids))
                    self.metrics.scheduled(seq.request)
            running += 1

    def in_flight(self) -> list[Sequence]:
        return [*self.prefilling, *(seq for runner in self.runners.values() for seq in runner.rows)]

    def _batch_limited(self) -> bool:
        """Whether batch work is held to `batch_rows_beside_interactive` now: interactive work runs or waits
        and the limit is below the slots."""
        if self.batch_rows_beside_interactive >= self.max_num_seqs:
            return False
        return self.waiting.has_waiting("interactive") or any(
            seq.priority_class == "interactive" and not seq.finished for seq in self.in_flight())

    def _prefills_now(self, seq: Sequence, first: bool, interactive_decoding: bool, batch_decoding: bool) -> bool:
        """Which prompts this pass may prefill: interactive ones go before the step's decode (a newcomer's
        first token waits for no decode step); while batch work is limited beside interactive work, batch
        ones share a step with interactive rows' decode (a prefill stretches that step) only when no batch
        row decodes, so batch work never starves behind a steady stream of interactive work."""
        if seq.priority_class == "interactive":
            return True
        if first:
            return False
        limited = self.batch_rows_beside_interactive < self.max_num_seqs
        held_off = batch_decoding or self.batch_rows_beside_interactive == 0  # 0: no batch work beside interactive
        return not (limited and interactive_decoding and held_off)

    def prefill(self, decoding: bool, first: bool = False) -> bool:
        """Spend this step's prompt-token budget (`decoding`: streams wait on this step's tokens);
        whether any prompt finished its prefill.

        Called twice a step: `first`, before the decode, for interactive prompts (what the pacer allows);
        then after it, with what is left, for the rest. Short prompts (or short rests after cached starts
        of about the same length) are prefilled together in one padded forward; a long prompt (or one whose
        every position must be scored) goes alone, in chunks.
        Choices of one prompt share its prefill.
        """
        budget = self.pacer.budget(decoding) if first or self._budget_left is None else self._budget_left
        if not self.prefilling:
            if first:
                self._budget_left = budget
            return False
        began, planned = time.perf_counter(), budget
        decoding_classes = {seq.priority_class for runner in self.runners.values() for seq in runner.rows
                            if not seq.finished}
        allowed = [s for s in self.prefilling if self._prefills_now(s, first, "interactive" in decoding_classes,
                                                                    "batch" in decoding_classes)]
        started = [s for s in allowed if s.state is not None and not s.finished]
        fresh: list[Sequence] = []
        for seq in allowed:
            if seq.state is None and not seq.finished and (seq.recomputes or not any(
                    f.request is seq.request and f.prompt_index == seq.prompt_index and not f.recomputes
                    for f in fresh)):
                fresh.append(seq)
        if not started and not fresh:
            if first:
                self._budget_left = budget
            return False
        work, budget = self._plan_prefill(started, fresh, budget)
        done: list[tuple[Sequence, torch.Tensor]] = []
        for item in work:
            runner = self.runners[item.rows[0].request.model_name]
            output = self._attempt(list(item.rows), lambda item=item, runner=runner: runner.execute_prefill(item))
            if output is not FAILED:
                done.extend(output.done)
        self.pacer.prefilled(planned - budget, time.perf_counter() - began)
        self._budget_left = max(0, budget) if first else None
        self._start_decoding(done)
        return bool(done)

    def _plan_prefill(self, started: list[Sequence], fresh: list[Sequence], budget: int
                      ) -> tuple[list[PrefillWork], int]:
        """This pass's prefill forwards within `budget` prompt tokens, and the budget left: prompts under way
        continue first (their next chunk); each newcomer starts from its longest cached start (the prefix
        cache: a lookup is scheduling, as vLLM's KV manager does it), then goes alone (a chunk, or whole if
        it must be) or, short enough, with other newcomers of its model in one padded forward."""
        work: list[PrefillWork] = []
        for seq in started:
            take = self.runners[seq.request.model_name].chunk_for(seq, budget)
            if take > 0:
                work.append(PrefillWork((seq,), take))
                budget -= take
        together: dict[str, list[Sequence]] = {}
        for seq in fresh:
            if budget <= 0:
                break
            runner = self.runners[seq.request.model_name]
            cached = self._attempt([seq], lambda seq=seq, runner=runner: runner.attach_prefix(seq))
            if cached is FAILED:
                continue
            if cached is not None:
                self.metrics.prefix_lookup(seq.request.model_name, len(seq.prefill_ids), cached)
            rest = len(seq.prefill_ids) - seq.prefilled
            # A short prompt goes whole even past the budget's end (by less than a least forward): its piece
            # would cost about a forward's time alone, and its rest another forward next step.
            fits = rest <= max(budget, self.pacer.least)
            if seq.wants_prompt_logprobs or seq.media_inputs is not None or not fits or not runner.prefills_together(seq):
                take = runner.chunk_for(seq, budget)
                work.append(PrefillWork((seq,), take))
                budget -= take
            else:
                together.setdefault(seq.request.model_name, []).append(seq)
                budget -= rest
        for sequences in together.values():
            for group in cached_start_groups(sequences):
                work.append(PrefillWork(tuple(group), sum(len(s.prompt_ids) - s.prefilled for s in group),
                                        together=len(group) > 1))
        return work, budget

    def _start_decoding(self, done: list[tuple[Sequence, torch.Tensor]]) -> None:
        """Prefilled prompts: siblings copy the cache, each samples its first token, the rest join the batch."""
        first: dict[str, list[tuple[Sequence, torch.Tensor]]] = {}
        for seq, logits in done:
            if seq.recomputes:  # preempted and prefilled again: it decodes on from the token it last drew
                self.prefilling = [s for s in self.prefilling if s is not seq]
                runner = self.runners[seq.request.model_name]
                self._attempt([seq], lambda seq=seq, runner=runner: runner.rejoin(seq), runner)
                continue
            group = [seq] + [s for s in self.prefilling if s is not seq and s.request is seq.request
                             and s.prompt_index == seq.prompt_index and s.state is None and not s.finished
                             and not s.recomputes]
            self.prefilling = [s for s in self.prefilling if s not in group]
            if self._attempt(group, lambda seq=seq, group=group: self._share_prefill(seq, group)) is FAILED:
                continue
            first.setdefault(seq.request.model_name, []).extend(
                (member, logits) for member in group if not member.finished)
        for name, pairs in first.items():
            if not pairs:  # every prompt of this model was only scored
                continue
            members = [member for member, _ in pairs]
            runner = self.runners[name]
            if self._attempt(members, lambda: sample_rows(InputBatch(members),
                                                          torch.stack([logits for _, logits in pairs]))) is FAILED:
                continue
            self._attempt(members, lambda: runner.join([member for member in members if not member.finished]), runner)

    def _share_prefill(self, seq: Sequence, group: list[Sequence]) -> None:
        """A prompt's prefill done: the prefix cache keeps it, its sibling choices copy its cache, and a prompt
        only scored ends."""
        runner = self.runners[seq.request.model_name]
        runner.remember_prefix(seq)
        for sibling in group[1:]:
            runner.share_prefill(seq, sibling)
        for member in group:
            if member.max_tokens == 0:  # the prompt was only scored
                member.finish("length")


def _decode_and_sample(runner: ModelRunner, clock: StepClock, waiting: bool = False) -> StepOutput | None:
    """The model's decode step as a plan for its runner; the output applied to the rows."""
    if not runner.running:
        return None
    output = runner.execute(DecodePlan(runner.view(), clock, waiting))
    output.apply()
    clock.lap("sample")
    return output


def cached_start_groups(sequences: list[Sequence]) -> list[list[Sequence]]:
    """Newcomers in groups that prefill together: in each, every cached start (prefix-cache hit) is
    left-padded to the group's longest by at most CACHED_START_PADDING tokens or half that longest, so
    the padded keys/values stay near the real ones (a fresh prompt, with none cached, goes with the
    short ones), and the stacked cached starts hold at most CACHED_TOKENS_PER_FORWARD positions (an 8B
    model's keys/values take ~128 KB a token: a group's copy stays near 1 GB)."""
    groups: list[list[Sequence]] = []
    for seq in sorted(sequences, key=lambda s: -s.prefilled):
        if groups:
            group, longest = groups[-1], groups[-1][0].prefilled
            if (longest - seq.prefilled <= max(CACHED_START_PADDING, longest // 2)
                    and (len(group) + 1) * longest <= CACHED_TOKENS_PER_FORWARD):
                group.append(seq)
                continue
        groups.append([seq])
    return groups


def sample_rows(batch: InputBatch, logits: torch.Tensor) -> None:
    """Each row takes its next token from its row of `logits` ([rows, vocab]) (a prefill's first tokens)."""
    sample_batch(batch, logits).apply()
