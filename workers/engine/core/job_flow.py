"""A job's way through the engine thread: admitted (its model loaded first if need be), started, advanced
step by step, handed over to the output thread, and finished, refused, failed or cancelled.

The Engine's half that deals with single jobs (workers/engine/core/engine.py keeps the loop, the inbox,
the thread-safe API and the step's order); a mixin of it, over the Engine's own state: `requests` and
`task_jobs`, the scheduler, the output thread, the grammar compiler and the beam runner.
"""
from __future__ import annotations

import logging
import queue
import time

import protocol
from protocol import ModelRef, failpoints
from workers.engine.core.supervision import engine_fault_message
from workers.engine.errors import JobError, ModelLoadError
from workers.engine.parallel.mirrored_runner import GroupDown
from workers.engine.inputs.generation_job import GenerationJob
from workers.engine.output.processor import publish_due
from workers.engine.sequences import Handover
from workers.engine.tasks.kinds import task_kind

logger = logging.getLogger(__name__)
CANCEL_MEMORY_SECONDS = 300.0


class JobFlow:
    def _cancel(self, request_id: str) -> None:
        now = time.monotonic()
        self._cancelled = {rid: t for rid, t in self._cancelled.items() if now - t < CANCEL_MEMORY_SECONDS}
        self._cancelled[request_id] = now
        if self.grammars.cancel(request_id) or self.beams.cancel(request_id):
            self._job_done(request_id)
            return
        request = self.requests.pop(request_id, None)
        self.task_jobs.pop(request_id, None)
        if request is not None:
            request.closed = True
            for seq in request.sequences:
                seq.abort()
            self._job_done(request_id)
            self.metrics.forget(request)
            generated = sum(len(seq.completion_ids) for seq in request.sequences)
            logger.info("cancelled %s after %d tokens", request_id, generated)

    def _refuse_load(self, job: dict, error: Exception) -> None:
        if job["request_id"] in self._cancelled:
            self._job_done(job["request_id"])
        elif isinstance(error, ModelLoadError):
            self._refuse(job, protocol.error_message(error.status, str(error), "model", error.code))
        else:
            logger.error("loading %s failed", ModelRef.from_wire(job["model"]), exc_info=error)
            self._refuse(job, protocol.error_message(
                500, "The worker failed to load the model.", None, "internal_error"))

    def _admit(self, job: protocol.SubmitMessage) -> None:
        request_id = job["request_id"]
        if request_id in self._cancelled:
            self._job_done(request_id)
            return
        ref = ModelRef.from_wire(job["model"])
        name = ref.key
        try:
            if name not in self.models:  # admitted once the model is in; other streams go on meanwhile
                self.models_control.load(ref, "request").jobs.append(job)
                return
            model = self.manager.use(name)
            kind = task_kind(job["prompts"][0])
            if kind is not None:
                request = kind.make(job, model)
                request.kind = kind
            else:
                request = GenerationJob(job, model, self.config.templates, self.handover)
                if request.beam is not None and model.parallel is not None:  # beams run generate() on rank 0 alone
                    raise JobError(400, f"The model `{name}` is split over tensor-parallel ranks, which serve no "
                                        "beam search (num_beams); sample, or serve it on one device.",
                                   "num_beams", "unsupported_parameter")
            request.model_name = model.base_key or name  # an adapter's rows run in its base's batch
            request.served_name = name
        except JobError as exc:
            self._refuse(job, exc.message_dict())
            return
        except ModelLoadError as exc:
            self._refuse(job, protocol.error_message(exc.status, str(exc), "model", exc.code))
            return
        except Exception:
            logger.exception("could not admit %s", request_id)
            self._refuse(job, protocol.error_message(500, "The worker failed to start this request.", None, "internal_error"))
            return
        if isinstance(request, GenerationJob) and request.structured:
            self.grammars.add(request)  # admitted once its grammar is compiled (_check_compiles)
            return
        self._start(request)

    def _start(self, request: GenerationJob) -> None:
        self.emit(request.reply_channel, request.started_message())
        if not isinstance(request, GenerationJob):  # a task: advanced and published by the engine thread
            self.requests[request.request_id] = self.task_jobs[request.request_id] = request
            self._publish(request)
            return
        if request.beam is not None:
            request.hand_over_to(Handover())  # its tokens come from the beam thread, handed over at its end
            self._finish_empty_sequences(request)
            self.beams.submit(request)  # beside the batch, in a thread of its own
            return
        self._finish_empty_sequences(request)
        self.requests[request.request_id] = request
        self.scheduler.enqueue([seq for seq in request.sequences if not seq.finished])
        self._hand_over()

    def _check_compiles(self) -> None:
        """Admit requests whose grammar is ready; refuse those whose grammar failed or took too long."""
        for request, matcher, error in self.grammars.resolved():
            if error is not None:
                self._refuse({"request_id": request.request_id, "reply_channel": request.reply_channel}, error)
                continue
            request.constrain(matcher)
            self._start(request)

    def _beam_done(self, request_id: str) -> None:
        finished = self.beams.take(request_id)
        if finished is None:  # cancelled meanwhile
            return
        request, error = finished
        if error is not None:
            logger.error("beam search failed for %s", request_id, exc_info=error)
            self._fail(request)
            return
        self.output.step(request.sequences[0].handover.take(), time.monotonic())

    def _refuse(self, job: dict, message: dict) -> None:
        self._job_done(job["request_id"])
        self.emit(job["reply_channel"], message)

    def _finish_empty_sequences(self, request: GenerationJob) -> None:
        """max_tokens = 0: nothing to generate; echo + logprobs still prefills (in chunks) to score the prompt."""
        for seq in request.sequences:
            if seq.max_tokens == 0 and not seq.wants_prompt_logprobs:
                seq.finish("length")

    def _advance_tasks(self) -> None:
        """Transcriptions by one audio window, embeddings and pair scores by one batched forward per model,
        between the batch's decode steps; each publishes what it has."""
        by_kind: dict = {}
        for request in self.task_jobs.values():
            by_kind.setdefault(request.kind, []).append(request)
        for kind, jobs in by_kind.items():
            for batch in [jobs] if kind.together else [[job] for job in jobs]:
                try:
                    kind.advance(batch, self.config.embedding_batch)
                except Exception:  # these jobs fail alone; the batch and the other kinds go on
                    logger.exception("a %s step failed for %d job(s)", kind.name, len(batch))
                    for request in batch:
                        self._fail(request)
        for request in list(self.task_jobs.values()):
            self._publish(request)

    def _hand_over(self) -> None:
        """This step's tokens and ended choices go to the output thread in one list; generation jobs the
        engine is done with leave it (the output thread still has their last messages to send)."""
        self._fail_broken()
        entries = self.handover.take()
        if not entries:
            return
        self.output.step(entries, time.monotonic())
        for seq, _token, _logprob, _top, reason in entries:
            if reason is not None:
                self._retire(seq.request)

    def _retire(self, request) -> None:
        if request.finished and self.requests.get(request.request_id) is request:
            del self.requests[request.request_id]

    def _take_stopped(self) -> None:
        """Choices the output thread ended on a stop string stop decoding here too."""
        while True:
            try:
                seq = self._stopped.get_nowait()
            except queue.Empty:
                return
            seq.stopped_by_text()
            self._retire(seq.request)

    def _answered_well(self, request, usage: dict) -> None:
        """The output thread sent a generation job's last message."""
        self.manager.touch(request.model_name)  # idle time counts from the last request's end
        self.metrics.finished(request, usage)

    def _fail_broken(self) -> None:
        """Requests one of whose forwards raised fail alone (their rows are already out of the batch);
        every other request, of this model or another, goes on."""
        for seq, exc in self.scheduler.take_failures():
            request = seq.request
            if self.requests.get(request.request_id) is request:
                reason = f"{type(exc).__name__}: {exc}"[:300]
                own = isinstance(exc, GroupDown)  # a split model's group went down: it is being loaded again
                self._fail(request, protocol.error_message(
                    exc.status if own else 500, f"Generation failed on the worker ({reason}).", None,
                    exc.code if own else "internal_error"))

    def _fail(self, request: GenerationJob, message: dict | None = None) -> None:
        self.requests.pop(request.request_id, None)
        self.task_jobs.pop(request.request_id, None)
        for seq in request.sequences:
            seq.abort()
        self.metrics.forget(request)
        message = message or protocol.error_message(500, "Generation failed on the worker.", None, "internal_error")
        if isinstance(request, GenerationJob):
            self.output.fail(request, message)  # after what it was already due, in order
            return
        self._job_done(request.request_id)
        self.emit(request.reply_channel, message)

    def _publish(self, request) -> None:
        """Publish what a task has due; a failure here stops this request alone, never its neighbours in the batch."""
        try:
            self._publish_due(request)
        except Exception as exc:
            logger.exception("publishing %s failed; that request is stopped", request.request_id)
            try:
                self._fail(request, engine_fault_message(str(exc) or type(exc).__name__))
            except Exception:  # the client hears the silence instead (the web side's worker-silence bound)
                logger.exception("telling %s of its failure failed", request.request_id)

    def _publish_due(self, request) -> None:
        """A task's message when it has something due: its first result at once, then (streamed) its new
        deltas, and everything with the usage when it is done (generation jobs: the output thread's)."""
        if request.request_id not in self.requests:
            return
        failpoints.hit("engine.publish")
        publish_due(request, request.finished, self.config.stream_interval, self.emit, self._task_answered)

    def _task_answered(self, request, usage: dict) -> bool:
        self.requests.pop(request.request_id, None)
        self.task_jobs.pop(request.request_id, None)
        self._job_done(request.request_id)
        self.manager.touch(request.model_name)  # idle time counts from the last request's end
        self.metrics.finished(request, usage)
        return True
