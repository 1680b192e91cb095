"""The generation engine: a thread running a continuous-batching loop over every admitted sequence.

Plain Python + torch + transformers. It knows nothing of HTTP, Django or the
channel layer: jobs come in as `protocol` dicts, and every outgoing
message goes through the `emit(reply_channel, message)` callable it was given.

Each step: drop finished rows, let waiting sequences in (up to `max_num_seqs`),
prefill interactive newcomers (publishing their first tokens), decode one token for
every running sequence in one batched forward, publish one message per request, then
prefill the other newcomers within the step's token budget and publish their first
tokens at once (they decode with the batch from the next step).
A transcription (workers.engine.tasks.transcription) advances by one audio window per step, embedding jobs
(workers.engine.tasks.embedding) and pair scores (workers.engine.tasks.pair_scoring) by one batched forward per model per step.
Which sequences run and the step's forwards are workers/engine/core/scheduler.py's; this
module owns jobs, models, control messages and publishing.
"""
from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable

import torch

import protocol
from protocol import failpoints
from workers.engine.tasks.beam_search import BeamRunner
from workers.engine.config import EngineConfig
from workers.engine.cpu_share import ThreadGovernor
from workers.engine.errors import JobError, ModelLoadError
from workers.engine.sample.grammars import GrammarCompiler, PendingGrammars
from workers.engine.core.loading import LOAD_FINISHED, Loader
from workers.engine.core.model_control import ModelControl
from workers.engine.core.metrics import EngineMetrics
from workers.engine.models.model_loader import LoadOptions, resolve_device, set_attention_backends
from workers.engine.core.model_manager import ModelManager
from workers.engine.execution.runner import RunnerSettings
from protocol import ModelRef
from workers.engine.core.scheduler import Scheduler
from workers.engine.inputs.generation_job import GenerationJob
from workers.engine.output.processor import OutputProcessor, publish_due
from workers.engine.sequences import Handover
from workers.engine.core.supervision import JobBook, Supervisor, engine_dead_message, engine_fault_message
from workers.engine.tasks.kinds import task_kind

logger = logging.getLogger(__name__)

Emit = Callable[[str, dict], None]
CANCEL_MEMORY_SECONDS = 300.0
IDLE_CHECK_SECONDS = 0.5
GAUGE_SECONDS = 0.1  # the queue gauges are set at most this often while busy (counting costs per step)
CONTROL_TYPES = (protocol.MODEL_LOAD, protocol.MODEL_UNLOAD, protocol.MODEL_SETTINGS)
WAKE = {"type": "engine.wake"}  # a grammar compiled, or a beam search ended: look again
BEAM_DONE = "engine.beam_done"


class Engine:
    def __init__(self, emit: Emit, config: EngineConfig = EngineConfig(),
                 on_model_event: Callable[[protocol.ModelChange], None] | None = None, name: str = "",
                 on_dead: Callable[[str], None] | None = None) -> None:
        self.emit = emit
        self.name = name
        device = resolve_device(config.device)
        set_attention_backends(device, config.cudnn_attention)
        self.config = config = config.fitted(device.type)
        self.max_num_seqs = config.max_num_seqs
        self.metrics = EngineMetrics()
        self.manager = ModelManager(config.device, config.dtype, config.model_timeout, config.memory_budget_bytes,
                                    _both_callbacks(EngineMetrics.model_loaded, on_model_event),
                                    RunnerSettings(config.prefill_chunk, config.prefix_cache_bytes, config.max_num_seqs,
                                                   config.static_decode == "on", config.cuda_graphs),
                                    load_defaults=LoadOptions(config.quantization, False, config.attn_implementation,
                                                              max_model_len=config.max_model_len,
                                                              generation_config=config.generation_config))
        if config.seed is not None:  # vLLM's --seed: requests without a seed draw from this reproducible stream
            torch.manual_seed(config.seed)
        self.models = self.manager.models  # name@revision -> LoadedModel, owned by the manager
        self.runners = self.manager.runners
        self.loader = Loader(self.manager, self._wake)
        self.models_control = ModelControl(self.manager, self.loader, emit, name, self._busy, self._admit, self._refuse_load)
        self._idle_checked = 0.0
        self._gauges_set = 0.0
        self.grammars = PendingGrammars(GrammarCompiler(config.grammar_timeout, config.grammar_cache_size),
                                        lambda: self._inbox.put(WAKE))
        self.beams = BeamRunner(lambda request_id: self._inbox.put({"type": BEAM_DONE, "request_id": request_id}))
        self.requests: dict[str, GenerationJob] = {}  # every job running here (generation and the others)
        self.task_jobs: dict[str, object] = {}  # the jobs that are not generation (embeddings, scores, transcriptions)
        self.handover = Handover()  # this step's tokens and ended choices, for the output thread
        self._stopped: queue.SimpleQueue = queue.SimpleQueue()  # choices a stop string ended (from the output thread)
        self.scheduler = Scheduler(self.runners, self.metrics, config)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled: dict[str, float] = {}
        self.jobs = JobBook()  # jobs submitted and not yet answered: admission control, and who hears of a fault
        self.supervisor = Supervisor(config.max_faults, config.stall_seconds, on_dead)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.threads: ThreadGovernor | None = None  # torch's thread count, chosen on the engine thread
        self.output = OutputProcessor(emit, self.jobs.done, self._answered_well, self.metrics.tokens,
                                      self._stopped.put, engine_fault_message, config.stream_interval)

    # --- thread-safe API -------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            if self.config.gil_switch_ms > 0:  # the event loop and the output thread get the GIL back sooner
                sys.setswitchinterval(self.config.gil_switch_ms / 1000)
            self.output.start()
            self._thread = threading.Thread(target=self._run, name="inference-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._inbox.put(None)
        self.loader.stop()
        if self._thread is not None:
            self._thread.join(timeout)
        self.output.stop(timeout)
        self.grammars.compiler.shutdown()
        self.beams.shutdown()

    @property
    def outstanding(self) -> int:
        """Jobs submitted and not yet finished, cancelled or refused."""
        return len(self.jobs)

    def has_room(self) -> bool:
        """Whether one more job fits: running plus queued stays within max_num_seqs + max_queue."""
        return len(self.jobs) < self.max_num_seqs + self.config.max_queue

    def problem(self) -> str | None:
        """Why this engine cannot serve (dead, its thread ended, its loop stalled), or None."""
        return self.supervisor.problem(self._thread) or self.output.problem()

    def stats(self) -> dict[str, int]:
        """Counters for monitoring, safe to read from any thread (a snapshot, not a transaction)."""
        runners = list(self.runners.values())
        totals = {"torch_threads": self.threads.threads if self.threads else 0,
                  "running_sequences": sum(runner.running for runner in runners),
                  "waiting_sequences": len(self.scheduler.waiting),
                  "kv_cache_bytes": sum(runner.batch.used_bytes() for runner in runners),
                  "prefix_cache_lookup_tokens": 0, "prefix_cache_hit_tokens": 0,
                  "prefix_cache_blocks": 0, "prefix_cache_bytes": 0}
        for runner in runners:
            if runner.prefix_cache is not None:
                for key, value in runner.prefix_cache.stats().items():
                    totals[key] += value
        return totals

    def submit(self, job: protocol.SubmitMessage) -> None:
        with self.jobs.lock:  # a job submitted as the engine dies is answered here or by the dying thread
            dead = self.supervisor.dead
            if dead is None:
                self.jobs.add(job["request_id"], job["reply_channel"])
        if dead is not None:
            self.emit(job["reply_channel"], engine_dead_message(dead))
            return
        self._inbox.put(job)

    def cancel(self, request_id: str) -> None:
        self._inbox.put(protocol.cancel_message(request_id))

    def control(self, message: protocol.ControlMessage | protocol.SettingsMessage) -> None:
        """A model.load / model.unload / model.settings message; handled in order with jobs."""
        self._inbox.put(message)

    def _wake(self, message: dict) -> None:
        """The loader thread's word that a load finished."""
        self._inbox.put(message)

    # --- engine thread ---------------------------------------------------
    def _job_done(self, request_id: str) -> None:
        self.jobs.done(request_id)

    def _run(self) -> None:
        """The loop, supervised: a failing turn fails the jobs held and the loop goes on; too many
        in a row, or anything that escapes, and the engine is dead (workers/supervision.py)."""
        reason = "the engine thread ended"
        try:
            self.threads = ThreadGovernor(self.config.torch_threads)
            with torch.inference_mode():
                while not self._stopping.is_set():
                    self.supervisor.beat()
                    try:
                        if self._turn():  # faults in a row count turns that had work
                            self.supervisor.turn_ok()
                    except Exception as exc:
                        if not self.supervisor.fault(exc):
                            reason = f"{self.supervisor.faults_in_a_row} loop failures in a row, the last: {exc}"
                            break
                        self._fail_all(engine_fault_message(str(exc) or type(exc).__name__))
                        time.sleep(0.05 * self.supervisor.faults_in_a_row)
        except BaseException as exc:
            logger.critical("the engine thread failed", exc_info=exc)
            reason = f"the engine thread failed: {exc}"
        if not self._stopping.is_set():
            with self.jobs.lock:  # from here on, submit() answers new jobs itself
                self.supervisor.die(reason)
            self._fail_all(engine_dead_message(reason))
            self.supervisor.announce()

    def _turn(self) -> bool:
        """One turn of the loop; whether it had requests to work on."""
        self._drain_inbox(block=not self.requests)
        busy = bool(self.requests or self.grammars)
        if busy:
            failpoints.hit("engine.loop")
        if self.grammars:
            self._check_compiles()
        self.threads.adjust()
        if time.monotonic() - self._idle_checked > IDLE_CHECK_SECONDS:
            self._idle_checked = time.monotonic()
            try:
                self.manager.unload_idle(self._busy())
            except Exception:
                logger.exception("idle unloading failed")
        if self.requests:
            try:
                self._step()
            except Exception:
                logger.exception("engine step failed; failing the running requests")
                for request in list(self.requests.values()):
                    self._fail(request)
            # Hand the GIL over once per step so the event loop (HTTP, channel layer)
            # is never starved by a fast model's Python-bound steps.
            time.sleep(0)
        if not self.requests or time.monotonic() - self._gauges_set >= GAUGE_SECONDS:
            self._gauges_set = time.monotonic()
            self.metrics.queues(self.requests.values(), self.scheduler.waiting)
            self.metrics.step_phases(self.scheduler.clock)
            self.metrics.teams(self.scheduler.in_flight(), self.scheduler.waiting)
        return busy

    def _fail_all(self, message: dict) -> None:
        """After a fault outside one request's work: every job held hears `message`, and is forgotten
        (the loop's state may be half-updated; nothing of those jobs is trusted again)."""
        for request in list(self.requests.values()):
            request.closed = True  # the output thread says nothing more of it
            for seq in request.sequences:
                seq.abort()
            self.metrics.forget(request)
        self.requests.clear()
        self.task_jobs.clear()
        self.handover.take()
        self.scheduler.waiting.clear()
        now = time.monotonic()
        for request_id, reply in self.jobs.take_all().items():
            self.grammars.cancel(request_id)
            self.beams.cancel(request_id)
            self._cancelled[request_id] = now  # if it surfaces later (inbox, a load, a grammar): dropped
            try:
                self.emit(reply, message)
            except Exception:
                logger.exception("could not tell %s of the engine fault", request_id)

    def _drain_inbox(self, block: bool) -> None:
        messages = []
        try:
            messages.append(self._inbox.get(timeout=1.0) if block else self._inbox.get_nowait())
            while True:
                messages.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        messages = [m for m in messages if m is not None]
        for message in messages:
            if message["type"] == protocol.CANCEL:
                self._cancel(message["request_id"])
        for message in messages:
            if message["type"] == protocol.SUBMIT:
                self._admit(message)
            elif message["type"] == BEAM_DONE:
                self._beam_done(message["request_id"])
            elif message["type"] in CONTROL_TYPES:
                self.models_control.handle(message)
            elif message["type"] == LOAD_FINISHED:
                self.models_control.finished(message["model"])

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

    def _busy(self) -> set[str]:
        return ({request.model_name for request in self.requests.values()}
                | {getattr(request, "served_name", request.model_name) for request in self.requests.values()}
                | self.grammars.models() | self.beams.models())

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

    # --- one step --------------------------------------------------------
    def _step(self) -> None:
        """Let newcomers in and prefill the interactive ones, decode the running batch and publish, then
        prefill the other newcomers and publish their first tokens.

        Newcomers' first tokens go out as soon as their prefill ends (time to first token is
        the prefill, not prefill + a decode step). An interactive newcomer is prefilled before the
        step's decode, so it waits for no decode step of a full box and joins the batch at once;
        the others join it from the next step.
        """
        started = time.perf_counter()
        clock = self.scheduler.clock
        clock.start()
        self._take_stopped()
        self.scheduler.admit()
        clock.lap("schedule")
        first = self.scheduler.prefill(self.scheduler.decoding(), first=True)
        clock.lap("prefill")
        if first:
            self._hand_over()
            clock.lap("hand_over")
        decoded = self.scheduler.decode()
        if self.task_jobs:
            self._advance_tasks()
            clock.lap("tasks")
        self._hand_over()
        clock.lap("hand_over")
        second = self.scheduler.prefill(bool(decoded))
        clock.lap("prefill")
        if second:
            self._hand_over()
            clock.lap("hand_over")
        clock.steps += 1
        self.metrics.step_took(time.perf_counter() - started)

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
                self._fail(request, protocol.error_message(
                    500, f"Generation failed on the worker ({reason}).", None, "internal_error"))

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


def _both_callbacks(first: Callable[[dict], None], then: Callable[[dict], None] | None) -> Callable[[dict], None]:
    """One callback that calls both (the second may be None)."""
    def both(event: dict) -> None:
        first(event)
        if then is not None:
            then(event)
    return both
