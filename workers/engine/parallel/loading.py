"""Loading a model split over ranks, and its runner: the rest of the engine sees one LoadedModel."""
from __future__ import annotations

from workers.engine.errors import ModelLoadError
from workers.engine.execution.runner import ModelRunner, RunnerSettings
from workers.engine.models.model_loader import LoadedModel, LoadOptions, Progress, load_model, resolve_device
from workers.engine.parallel.group import TensorParallelGroup
from protocol import ModelRef


def load_split(ref: ModelRef, device: str, dtype: str, progress: Progress | None, options: LoadOptions) -> LoadedModel:
    """Rank 0's shard, loaded here while the followers load theirs; memory counts every rank's share."""
    group = TensorParallelGroup.start(ref.key, resolve_device(device), dtype, options)
    try:
        loaded = load_model(ref, device, dtype, progress, options)
        group.wait_loaded()
    except Exception as exc:
        reason = group.follower_error()
        group.close()
        if reason is not None and reason != str(exc):
            raise ModelLoadError(f"{exc} (a follower rank: {reason})") from exc
        raise
    loaded.parallel = group
    loaded.memory_bytes += sum(group.follower_bytes)
    return loaded


def runner_for(loaded: LoadedModel, settings: RunnerSettings) -> ModelRunner:
    """The model's runner: rank 0's mirrored one for a split model."""
    if loaded.parallel is None:
        return ModelRunner(loaded, settings)
    from workers.engine.parallel.mirrored_runner import MirroredRunner

    return MirroredRunner(loaded, settings)
