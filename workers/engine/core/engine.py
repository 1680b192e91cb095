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
from protocol import ModelRef, failpoints
from workers.engine.tasks.beam_search import BeamRunner
from workers.engine.config import EngineConfig
from workers.engine.cpu_share import ThreadGovernor
from workers.engine.sample.grammars import GrammarCompiler, PendingGrammars
from workers.engine.core.loading import LOAD_FINISHED, Loader
from workers.engine.core.model_control import ModelControl
from workers.engine.core.metrics import EngineMetrics
from workers.engine.models.model_loader import LoadOptions, resolve_device, set_attention_backends
from workers.engine.core.job_flow import JobFlow
from workers.engine.core.model_manager import ModelManager
from workers.engine.execution.kv.budget import KVBudgetSetting
from workers.engine.execution.runner import RunnerSettings
from workers.engine.core.scheduler import Scheduler
from workers.engine.inputs.generation_job import GenerationJob
from workers.engine.output.processor import OutputProcessor
from workers.engine.sequences import Handover
from workers.engine.core.supervision import JobBook, Supervisor, engine_dead_message, engine_fault_message

logger = logging.getLogger(__name__)

Emit = Callable[[str, dict], None]
IDLE_CHECK_SECONDS = 0.5
GAUGE_SECONDS = 0.1  # the queue gauges are set at most this often while busy (counting costs per step)
CONTROL_TYPES = (protocol.MODEL_LOAD, protocol.MODEL_UNLOAD, protocol.MODEL_SETTINGS)
WAKE = {"type": "engine.wake"}  # a grammar compiled, or a beam search ended: look again
BEAM_DONE = "engine.beam_done"


class Engine(JobFlow):
    """The engine thread: the loop, its inbox, its supervision and the order of a step (jobs: JobFlow)."""

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
                                                   config.static_decode == "on", config.cuda_graphs,
                                                   config.speculative,
                                                   KVBudgetSetting(server_bytes=config.kv_cache_bytes,
                                                                   utilization=config.gpu_memory_utilization),
                                                   config.rows_apart_bytes),
                                    load_defaults=LoadOptions(config.quantization, False, config.attn_implementation,
                                                              max_model_len=config.max_model_len,
                                                              tensor_parallel_size=config.tensor_parallel_size,
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
        for loaded in list(self.models.values()):  # follower ranks stop with their model's worker
            if loaded.parallel is not None:
                loaded.parallel.close()

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
                  "kv_cache_budget_bytes": sum(runner.kv_budget.bytes for runner in runners),
                  "prefix_cache_lookup_tokens": 0, "prefix_cache_hit_tokens": 0,
                  "prefix_cache_blocks": 0, "prefix_cache_spans": 0, "prefix_cache_checkpoints": 0,
                  "prefix_cache_bytes": 0}
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
    def _threads_beside(self) -> list[int]:
        """The process's main thread (the event loop serving HTTP, or the worker's) and the output thread."""
        return [thread.native_id for thread in (threading.main_thread(), self.output.thread)
                if thread is not None and thread.native_id is not None]

    def _job_done(self, request_id: str) -> None:
        self.jobs.done(request_id)

    def _run(self) -> None:
        """The loop, supervised: a failing turn fails the jobs held and the loop goes on; too many
        in a row, or anything that escapes, and the engine is dead (workers/supervision.py)."""
        reason = "the engine thread ended"
        try:
            self.threads = ThreadGovernor(self.config.torch_threads, beside=self._threads_beside)
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
        if self.manager.split:
            self._reload_broken()
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
            self.metrics.kv_usage(self.runners)
        return busy

    def _reload_broken(self) -> None:
        """A model whose tensor-parallel group went down (a rank died, a collective failed): its requests fail
        now, it is unloaded (the catalog hears why) and loaded again; requests meanwhile wait for that load."""
        for name, why in self.manager.broken():
            message = protocol.error_message(503, f"The model `{name}` stopped ({why}); it is being loaded again, "
                                                  "retry shortly.", None, "model_restarting")
            for request in [r for r in self.requests.values() if r.model_name == name]:
                self._fail(request, message)
            self.manager.unload(name, set(), requested_by="fault", error=why)
            try:
                self.models_control.load(ModelRef.parse(name), requested_by="restart")
            except Exception:
                logger.exception("reloading %s after its fault failed", name)

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

    def _busy(self) -> set[str]:
        return ({request.model_name for request in self.requests.values()}
                | {getattr(request, "served_name", request.model_name) for request in self.requests.values()}
                | self.grammars.models() | self.beams.models())

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

def _both_callbacks(first: Callable[[dict], None], then: Callable[[dict], None] | None) -> Callable[[dict], None]:
    """One callback that calls both (the second may be None)."""
    def both(event: dict) -> None:
        first(event)
        if then is not None:
            then(event)
    return both
