"""The generation engine: a thread that admits jobs, steps every running sequence, emits deltas.

Plain Python + torch + transformers. It knows nothing of HTTP, Django or the
channel layer: jobs come in as `workers.protocol` dicts, and every outgoing
message goes through the `emit(reply_channel, message)` callable it was given.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import torch

from . import protocol
from .model_loader import LoadedModel, ModelLoadError, load_model
from .runner import ModelRunner
from .sequences import JobError, Request

logger = logging.getLogger(__name__)

Emit = Callable[[str, dict], None]
CANCEL_MEMORY_SECONDS = 300.0


class Engine:
    def __init__(self, emit: Emit, device: str = "auto", dtype: str = "auto", torch_threads: int = 0) -> None:
        self.emit = emit
        self.device = device
        self.dtype = dtype
        self.torch_threads = torch_threads
        self.runner = ModelRunner()
        self.models: dict[str, LoadedModel] = {}
        self.requests: dict[str, Request] = {}
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled: dict[str, float] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # --- thread-safe API -------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="inference-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, job: dict) -> None:
        self._inbox.put(job)

    def cancel(self, request_id: str) -> None:
        self._inbox.put({"type": protocol.CANCEL, "request_id": request_id})

    @property
    def active_requests(self) -> int:
        return len(self.requests)

    # --- engine thread ---------------------------------------------------
    def _run(self) -> None:
        if self.torch_threads > 0:
            torch.set_num_threads(self.torch_threads)
        with torch.inference_mode():
            while not self._stopping.is_set():
                self._drain_inbox(block=not self.requests)
                if self.requests:
                    self._step()

    def _drain_inbox(self, block: bool) -> None:
        messages = []
        try:
            messages.append(self._inbox.get(timeout=1.0) if block else self._inbox.get_nowait())
            while True:
                messages.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        for message in messages:
            if message is None:
                continue
            if message["type"] == protocol.CANCEL:
                self._cancel(message["request_id"])
        for message in messages:
            if message is not None and message["type"] == protocol.SUBMIT:
                self._admit(message)

    def _cancel(self, request_id: str) -> None:
        now = time.monotonic()
        self._cancelled = {rid: t for rid, t in self._cancelled.items() if now - t < CANCEL_MEMORY_SECONDS}
        self._cancelled[request_id] = now
        request = self.requests.pop(request_id, None)
        if request is not None:
            for seq in request.sequences:
                seq.state = None
            generated = sum(len(seq.completion_ids) for seq in request.sequences)
            logger.info("cancelled %s after %d tokens", request_id, generated)

    def _model(self, name: str) -> LoadedModel:
        loaded = self.models.get(name)
        if loaded is None:
            loaded = load_model(name, self.device, self.dtype)
            self.models[name] = loaded
        loaded.last_used = time.monotonic()
        return loaded

    def _admit(self, job: dict) -> None:
        request_id, reply = job["request_id"], job["reply_channel"]
        if request_id in self._cancelled:
            return
        try:
            request = Request(job, self._model(job["model"]))
            self._finish_empty_sequences(request)
        except JobError as exc:
            self.emit(reply, exc.message_dict())
            return
        except ModelLoadError as exc:
            status = 404 if exc.not_found else 503
            self.emit(reply, protocol.error_message(status, str(exc), "model", "model_not_found" if exc.not_found else "model_load_failed"))
            return
        except Exception:
            logger.exception("could not admit %s", request_id)
            self.emit(reply, protocol.error_message(500, "The worker failed to start this request.", None, "internal_error"))
            return
        self.emit(reply, request.started_message())
        self.requests[request_id] = request
        self._publish(request)

    def _finish_empty_sequences(self, request: Request) -> None:
        """max_tokens = 0: nothing to generate; echo + logprobs still scores the prompt."""
        for seq in request.sequences:
            if seq.max_tokens == 0:
                if seq.wants_prompt_logprobs:
                    seq.record_prompt_logprobs(self.runner.prompt_logits(request.model, seq)[:-1])
                seq.finish("length")

    def _step(self) -> None:
        by_model: dict[str, list] = {}
        for request in self.requests.values():
            for seq in request.sequences:
                if not seq.finished:
                    by_model.setdefault(request.model.model_id, []).append(seq)
        for sequences in by_model.values():
            loaded = sequences[0].request.model
            loaded.last_used = time.monotonic()
            try:
                logits = self.runner.step(loaded, sequences)
                for seq, row in zip(sequences, logits):
                    seq.accept(seq.sampler.choose(row, seq.prompt_ids, seq.completion_ids))
            except Exception:
                logger.exception("generation step failed")
                for request in {id(seq.request): seq.request for seq in sequences}.values():
                    self._fail(request)
        for request in list(self.requests.values()):
            self._publish(request)

    def _fail(self, request: Request) -> None:
        self.requests.pop(request.request_id, None)
        self.emit(request.reply_channel, protocol.error_message(500, "Generation failed on the worker.", None, "internal_error"))

    def _publish(self, request: Request) -> None:
        """One message per request per step: its new deltas, and the usage when it is done."""
        if request.request_id not in self.requests:
            return
        deltas = request.take_deltas()
        if request.finished:
            self.requests.pop(request.request_id, None)
            usage = request.usage()
            self.emit(request.reply_channel, {"type": protocol.DONE, "choices": deltas, "usage": usage})
            logger.info("finished %s: %d prompt + %d completion tokens in %.2fs", request.request_id,
                        usage["prompt_tokens"], usage["completion_tokens"], time.monotonic() - request.arrived)
        elif deltas:
            self.emit(request.reply_channel, {"type": protocol.DELTA, "choices": deltas})
