"""A request refused before its model is loaded when the catalog already knows the model cannot do it: a chat
or completion to a speech model (Whisper) was loaded, then refused by the worker (issue 49, item 11)."""
import protocol
from catalog.hf_cache import cached_served_models_now

from .errors import APIError


def refuse_wrong_task(model: protocol.ModelRef, task: str | None) -> None:
    """A 400 when the cache scan says `model` cannot do `task` (generate, transcribe, embed); nothing when no
    task is asked or the scan is not at hand (the worker still checks)."""
    entries = cached_served_models_now() if task else None
    entry = next((entry for entry in entries or () if entry.repo_id == model.repo_id), None)
    if entry is None or not entry.tasks or task in entry.tasks:
        return
    raise APIError(400, f"The model {model} cannot {task}: it is a model for {', '.join(entry.tasks)} "
                        f"(it takes: {', '.join(entry.modalities) or 'nothing'}).", "model", "unsupported_modality")
