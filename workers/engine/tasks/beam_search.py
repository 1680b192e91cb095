"""Beam search outside the continuous batch: Hugging Face's own `generate(num_beams=…)` in a thread.

Beams reorder and fork their caches every step, which the batch's left-padded rows do not
do; running `generate` itself keeps the result exactly Hugging Face's, and a thread of its
own keeps the batch decoding meanwhile. The finished beams are fed through each choice's
`accept` so stop strings, EOS, max_tokens and the text are handled as for any other choice.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from workers.engine.cpu_share import torch_on_one_thread
from workers.engine.sample.sampling import TokenChoice
from workers.engine.inputs.generation_job import GenerationJob


class _Cancelled(StoppingCriteria):
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


def beam_generate_kwargs(request: GenerationJob, prompt_index: int) -> dict:
    """generate()'s arguments for one prompt of a beam request (deterministic: no sampling)."""
    beam = request.beam
    choices = [seq for seq in request.sequences if seq.prompt_index == prompt_index]
    params = choices[0].sampler.params
    kwargs = dict(num_beams=beam["num_beams"], num_return_sequences=len(choices), do_sample=False,
                  length_penalty=beam["length_penalty"], early_stopping=beam["early_stopping"],
                  max_new_tokens=choices[0].max_tokens, min_new_tokens=params.min_tokens or None,
                  repetition_penalty=params.repetition_penalty,
                  no_repeat_ngram_size=params.no_repeat_ngram_size or None,
                  bad_words_ids=params.bad_words_ids or None,
                  eos_token_id=request.model.eos_token_ids or None,
                  pad_token_id=request.model.tokenizer.pad_token_id or 0)
    return kwargs


def run_beam_search(request: GenerationJob, cancelled: threading.Event) -> None:
    """Generate every prompt's beams and feed the best `n` to its choices."""
    model = request.model
    with torch.inference_mode():
        for prompt_index, ids in enumerate(request.prompt_ids):
            choices = [seq for seq in request.sequences if seq.prompt_index == prompt_index and not seq.finished]
            if not choices:
                continue
            input_ids = torch.tensor([ids], device=model.device)
            output = model.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids),
                stopping_criteria=StoppingCriteriaList([_Cancelled(cancelled)]),
                **beam_generate_kwargs(request, prompt_index))
            if cancelled.is_set():
                return
            for seq, row in zip(choices, output[:, len(ids):].tolist()):
                for token_id in row:
                    if seq.finished:
                        break
                    seq.accept(TokenChoice(token_id, None, []))
                seq.finish("stop")  # shorter than max_tokens without EOS: the beam ended itself


class BeamRunner:
    """One thread for beam requests; `on_done(request_id)` is called from it when one ends."""

    def __init__(self, on_done: Callable[[str], None]) -> None:
        self.on_done = on_done
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="beam-search",
                                        initializer=torch_on_one_thread)  # the engine's threads stay its own
        self.running: dict[str, tuple[GenerationJob, threading.Event, Future]] = {}

    def submit(self, request: GenerationJob) -> None:
        cancelled = threading.Event()
        future = self._pool.submit(run_beam_search, request, cancelled)
        self.running[request.request_id] = (request, cancelled, future)
        future.add_done_callback(lambda _f: self.on_done(request.request_id))

    def cancel(self, request_id: str) -> bool:
        entry = self.running.pop(request_id, None)
        if entry is not None:
            entry[1].set()
        return entry is not None

    def take(self, request_id: str) -> tuple[GenerationJob, BaseException | None] | None:
        """The finished request (and its error, if generate failed); None if it was cancelled."""
        entry = self.running.pop(request_id, None)
        if entry is None:
            return None
        return entry[0], entry[2].exception()

    def models(self) -> set[str]:
        return {request.model_name for request, _, _ in self.running.values()}

    def shutdown(self) -> None:
        for _, cancelled, _ in self.running.values():
            cancelled.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
