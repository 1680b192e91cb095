"""Loads, unloads and settings on the engine thread: `/load_model`, the admin's actions, a job's first use.

A load runs on the loader thread (workers/engine/core/loading.py); this decides it, answers the control
request's reply channel with progress, and when the load ends admits (or refuses) the jobs that
waited for the model. Unloading a model that is generating is refused (model_busy).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import protocol
from protocol import ModelRef
from workers.engine.errors import ModelBusyError, ModelLoadError
from workers.engine.core.loading import Listener, Loader, PendingLoad
from workers.engine.core.model_manager import ModelManager

logger = logging.getLogger(__name__)


class ModelControl:
    def __init__(self, manager: ModelManager, loader: Loader, emit: Callable[[str, dict], None], worker: str,
                 busy: Callable[[], set[str]], admit: Callable[[dict], None],
                 refuse: Callable[[dict, Exception], None]) -> None:
        self.manager, self.loader, self.emit, self.worker = manager, loader, emit, worker
        self.busy = busy  # the models with work under way (never unloaded)
        self.admit, self.refuse = admit, refuse  # what becomes of a job that waited for a load

    def load(self, ref: ModelRef, requested_by: str, listener: Listener | None = None) -> PendingLoad:
        """Start loading `ref` off this thread (or join the load under way); may raise ModelLoadError."""
        return self.loader.start(ref, self.busy(), requested_by, listener)

    def finished(self, name: str) -> None:
        """Admit the jobs that waited for the model, answer the load requests; or refuse them all."""
        pending, loaded, error = self.loader.finish(name)
        for listener in pending.listeners:
            if error is None:
                listener({"status": "ready", "model": name, "cached": False})
            else:
                listener({"status": "error", "model": name, "message": str(error),
                          "code": getattr(error, "code", "internal_error")})
        for job in pending.jobs:
            if error is None:
                self.admit(job)
            else:
                self.refuse(job, error)

    def handle(self, message: dict) -> None:
        """Load, unload or reconfigure models; progress goes to the message's reply channel, if any."""
        kind = message["type"]
        if kind == protocol.MODEL_SETTINGS:
            self.manager.configure(message.get("settings") or {})
            return
        ref = ModelRef.from_wire(message["model"])
        name = ref.key
        reply = message.get("reply_channel")

        def send(event: protocol.ModelEvent) -> None:
            if reply:
                self.emit(reply, protocol.progress_message(self.worker, event))

        requested_by = message.get("requested_by") or "control"
        try:
            if kind == protocol.MODEL_LOAD and name in self.manager.models:
                self.manager.use(name)
                send({"status": "ready", "model": name, "cached": True})
            elif kind == protocol.MODEL_LOAD:
                self.load(ref, requested_by, send)
            else:
                unloaded = self.manager.unload(name, self.busy(), requested_by)
                send({"status": "unloaded" if unloaded else "not_loaded", "model": name})
        except (ModelBusyError, ModelLoadError) as exc:
            send({"status": "error", "model": name, "message": str(exc), "code": exc.code})
        except Exception as exc:
            logger.exception("model control %s %s failed", kind, name)
            send({"status": "error", "model": name, "message": f"The worker failed: {exc}", "code": "internal_error"})
