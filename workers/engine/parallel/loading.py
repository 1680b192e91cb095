"""Loading a model split over ranks, and its runner: the rest of the engine sees one LoadedModel."""
from __future__ import annotations

from transformers import AutoConfig

from workers.engine.errors import ModelLoadError
from workers.engine.execution.runner import ModelRunner, RunnerSettings
from workers.engine.models.model_loader import LoadedModel, LoadOptions, Progress, load_model, resolve_device
from workers.engine.models.gguf_loading import find_gguf
from workers.engine.models.load_progress import download
from workers.engine.models.tensor_parallel_plan import check_tensor_parallel, refuse_tensor_parallel
from workers.engine.parallel.group import TensorParallelGroup
from protocol.hub import hub_reachable
from protocol.modalities import model_kind
from protocol import ModelRef


def load_split(ref: ModelRef, device: str, dtype: str, progress: Progress | None, options: LoadOptions) -> LoadedModel:
    """Rank 0's shard, loaded here while the followers load theirs; memory counts every rank's share."""
    precheck(ref, resolve_device(device), options, progress or (lambda stage, value=None: None))
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

    try:
        return MirroredRunner(loaded, settings)
    except Exception:  # its load-time forwards failed on some rank: the group goes with the model
        loaded.parallel.close()
        raise


def precheck(ref: ModelRef, device, options: LoadOptions, progress: Progress) -> None:
    """Before any rank starts: the model is in the cache (downloaded here once, not by every rank; an unknown
    one is a 404 without a process started) and passes the refusals that need only its config (load_model
    checks again)."""
    if find_gguf(ref, options.gguf_file) is not None:
        refuse_tensor_parallel(ref.key, options.tensor_parallel_size, "GGUF files load through transformers' GGUF "
                                                                      "reader, which does not shard")
    read = dict(revision=ref.branch, local_files_only=True, trust_remote_code=options.trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(ref.repo_id, **read)
    except OSError as missing:
        if not hub_reachable():
            raise ModelLoadError(f"The model `{ref.key}` does not exist or could not be read: {missing}",
                                 not_found=True) from missing
        try:
            download(ref.repo_id, ref.branch, progress)
            config = AutoConfig.from_pretrained(ref.repo_id, **read)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"The model `{ref.key}` does not exist or could not be read: {exc}",
                                 not_found=True) from exc
    except ValueError:  # a config transformers cannot read: load_model says why
        return
    check_tensor_parallel(ref.key, config, options.tensor_parallel_size, model_kind(config.to_dict()) or "causal",
                          device, options.quantization)
