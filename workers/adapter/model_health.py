"""Each model's recent outcomes on this worker: a model failing most requests is *degraded* (issue 49).

A model whose forward raises answered every request with a 500 while `/health` said ok. Here every job's end
(its `done`, or an error of status 500 or more, as the bridge sends it) is counted per model over the last
`WINDOW` jobs; past `MIN_JOBS` of them, more than half failed is degraded, with the last error. The worker's
ping carries it to `/health`; its heartbeat (and a change of state at once: `ended` says when) carries every
record to the catalog, whence `/v1/models`, the admin and `/metrics` read it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 10  # the last jobs per model that count
MIN_JOBS = 3  # fewer ended jobs say nothing yet


@dataclass
class ModelOutcomes:
    recent: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # True: failed
    last_error: str = ""

    @property
    def degraded(self) -> bool:
        return len(self.recent) >= MIN_JOBS and sum(self.recent) * 2 > len(self.recent)


class ModelHealth:
    """Outcomes by model name (the event loop's: the bridge records each job's end as it sends it)."""

    def __init__(self) -> None:
        self.models: dict[str, ModelOutcomes] = {}

    def ended(self, model: str, error: str | None) -> bool:
        """A job of `model` ended: well (`error` None) or with a server-side error. True when that made the
        model degraded, or no longer degraded (the catalog is told at once, not at the next heartbeat)."""
        outcomes = self.models.setdefault(model, ModelOutcomes())
        was = outcomes.degraded
        outcomes.recent.append(error is not None)
        if error is not None:
            outcomes.last_error = error
        return outcomes.degraded != was

    def forget(self, model: str) -> None:
        """Unloaded or reloaded: its record starts afresh."""
        self.models.pop(model, None)

    def record(self, model: str) -> dict:
        """{"degraded", "failed", "of", "last_error"} of one model (a model with no record: all clear)."""
        outcomes = self.models.get(model) or ModelOutcomes()
        return {"degraded": outcomes.degraded, "failed": sum(outcomes.recent), "of": len(outcomes.recent),
                "last_error": outcomes.last_error}

    def records(self) -> dict[str, dict]:
        """Every model's `record` (what the heartbeat carries to the catalog)."""
        return {name: self.record(name) for name in self.models}

    def degraded(self) -> dict[str, dict]:
        """{model: {"failed", "of", "last_error"}} for every degraded model."""
        return {name: {"failed": sum(o.recent), "of": len(o.recent), "last_error": o.last_error}
                for name, o in self.models.items() if o.degraded}
