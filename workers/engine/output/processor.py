"""The output thread: each step's token ids in, the clients' messages out, off the engine's step.

vLLM's engine core returns only ids and leaves detokenizing, stop strings and response building to
its API process (`output_processor.py`); SGLang has its DetokenizerManager. Here the web side may not
import a tokenizer, so the same work runs in a thread of the worker: the engine thread hands over one
list of (sequence, token id, logprob, top alternatives, finish reason) per step (`sequences.Handover`)
and goes on with the next step while this thread decodes text, finds stop strings, writes logprobs'
token texts, runs the tool/reasoning parsers and publishes one message per request that has
something due. Torch's kernels release the GIL, so on two cores this work overlaps the next forward.

Every message of a generation job after its `Started` goes out from here, in order: its deltas, its
`done`, or the error that ended it (`fail`). A stop string found here ends the choice a step or two
after the engine decoded past it: `stopped(seq)` tells the engine, and the extra tokens are neither
shown nor billed (workers/engine/output/choice_output.py).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import protocol
from protocol import failpoints

logger = logging.getLogger(__name__)

Emit = Callable[[str, dict], None]
STEP, FAIL = "step", "fail"


class OutputProcessor:
    """`answered(request_id)`: the job's final message may go out (False: it was answered already, as
    after an engine fault); `finished(request, usage)`: a job ended well (metrics, idle time);
    `tokens(sequences, when)`: these took a token at `when` (latency metrics); `stopped(seq)`: a stop
    string ended this choice (the engine stops decoding it); `fault(reason)`: the error a request gets when
    its output fails here."""

    def __init__(self, emit: Emit, answered: Callable[[str], bool], finished: Callable[[object, dict], None],
                 tokens: Callable[[list, float], None], stopped: Callable[[object], None],
                 fault: Callable[[str], dict], stream_interval: int) -> None:
        self.emit = emit
        self.fault = fault
        self.answered = answered
        self.finished = finished
        self.tokens = tokens
        self.stopped = stopped
        self.stream_interval = stream_interval
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._queued = 0  # events handed in and not yet done (tests and `wait_idle` read it)

    # --- the engine thread's side ---------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="inference-output", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def problem(self) -> str | None:
        """Why this thread cannot publish (it ended), or None."""
        if self._thread is not None and not self._thread.is_alive():
            return "the output thread ended"
        return None

    def step(self, entries: list, when: float) -> None:
        """A step's tokens and ended choices, in the order they were decided."""
        self._put((STEP, entries, when))

    def fail(self, request, message: dict) -> None:
        """End a generation job with `message` (an error) after whatever it was already due."""
        self._put((FAIL, request, message))

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until everything handed in is published (tests, a graceful stop)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._queued == 0, timeout)

    def _put(self, event: tuple) -> None:
        with self._idle:
            self._queued += 1
        self._inbox.put(event)

    # --- the output thread ------------------------------------------------------------------
    def _run(self) -> None:
        while (event := self._inbox.get()) is not None:
            try:
                if event[0] == STEP:
                    self._step(event[1], event[2])
                else:
                    self._fail(event[1], event[2])
            except Exception:  # one bad step's bookkeeping never ends the thread
                logger.exception("the output thread failed on a %s", event[0])
            finally:
                with self._idle:
                    self._queued -= 1
                    if self._queued == 0:
                        self._idle.notify_all()

    def _step(self, entries: list, when: float) -> None:
        touched: dict = {}  # requests with something new, in order -> whether a choice of it ended
        took: list = []
        for seq, token_id, logprob, top, reason in entries:
            request = seq.request
            if request.closed:
                continue
            output = seq.output
            try:
                if output.take(token_id, logprob, top, reason):
                    self.stopped(seq)
            except Exception as exc:
                logger.exception("output of %s failed; that request is stopped", request.request_id)
                self._failed_here(request, exc)
                continue
            if token_id is not None:
                took.append(seq)
            if output.finish_reason is not None:
                touched[request] = True
            elif request not in touched:
                touched[request] = False
        if took:
            try:
                self.tokens(took, when)
            except Exception:  # latency metrics are never worth a request's answer
                logger.exception("the output thread could not count a step's tokens")
        interval = self.stream_interval
        for request, ended in touched.items():
            if ended or not request.answered or request.due(interval):  # else nothing is due: held
                self._publish(request, ended)

    def _publish(self, request, ended: bool) -> None:
        """A message for the request when it has something due: its first token at once, then (streamed) its
        new deltas every `stream_interval` tokens, and everything with the usage when it is done (`ended`: a
        choice of it ended in this step)."""
        if request.closed:
            return
        try:
            failpoints.hit("engine.publish")
            publish_due(request, ended and request.answered_in_full, self.stream_interval, self.emit,
                        self._answered_in_full)
        except Exception as exc:
            logger.exception("publishing %s failed; that request is stopped", request.request_id)
            self._failed_here(request, exc)

    def _answered_in_full(self, request, usage: dict) -> bool:
        request.closed = True
        if not self.answered(request.request_id):
            return False  # answered already (an engine fault took it)
        self.finished(request, usage)
        return True

    def _failed_here(self, request, exc: Exception) -> None:
        """The request's output failed on this thread: it ends with an error, and the engine stops decoding it."""
        self._fail(request, self.fault(str(exc) or type(exc).__name__))
        for seq in request.sequences:
            self.stopped(seq)

    def _fail(self, request, message: dict) -> None:
        if request.closed:
            return  # cancelled, or answered already
        request.closed = True
        if self.answered(request.request_id):
            try:
                self.emit(request.reply_channel, message)
            except Exception:  # the client hears the silence instead (the web side's worker-silence bound)
                logger.exception("telling %s of its failure failed", request.request_id)


def publish_due(request, done: bool, stream_interval: int, emit: Emit, answered: Callable[[object, dict], bool]) -> None:
    """A job's message when it has something due: its first output at once, then (streamed) its new deltas
    every `stream_interval` tokens, and everything with the usage when it is `done` (sent only if
    `answered(request, usage)`, which counts it, says the job is still owed its answer). Generation jobs
    publish on the output thread, the other kinds on the engine thread, both through this."""
    if request.answered and not done and not request.due(stream_interval):
        return  # held: deltas pile up meanwhile (a non-streamed answer until the end)
    deltas = request.take_deltas()
    if done:
        usage = request.usage()
        if answered(request, usage):  # counted before the client can see it (and scrape /metrics)
            emit(request.reply_channel, protocol.done_message(deltas, usage))
            logger.info("finished %s: %d prompt + %d completion tokens in %.2fs", request.request_id,
                        usage["prompt_tokens"], usage["completion_tokens"], time.monotonic() - request.arrived)
    elif deltas:
        request.answered = True
        emit(request.reply_channel, protocol.delta_message(deltas))
