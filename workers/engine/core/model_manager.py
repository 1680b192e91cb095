"""Which models a worker holds: loading, per-model settings, idle unloading, a memory budget.

Plain Python + torch, called only from the engine thread (but `snapshot()`, which any
thread may read). Every load and unload is reported through `on_event(dict)` so the
worker's consumer can record it; nothing here knows of Django or the channel layer.
"""
from __future__ import annotations

import gc
import weakref
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

import protocol
from workers.engine.errors import MemoryBudgetError, ModelBusyError, ModelLoadError
from workers.engine.models import adapters
from workers.engine.models.model_loader import LoadedModel, LoadOptions, Progress, estimate_bytes, load_model
from workers.engine.output.parsing import OutputFormat, output_format
from workers.engine.output.parsing.factory import model_type_of
from protocol import ModelRef
from protocol.sizes import parse_bytes
from protocol.speculative import SpeculativeConfig, model_speculative_config
from workers.engine.execution.runner import ModelRunner, RunnerSettings
from workers.engine.parallel.loading import load_split, runner_for
from workers.engine.sample.sampling import MODEL_DEFAULT_KEYS

logger = logging.getLogger(__name__)

OnEvent = Callable[[protocol.ModelChange], None]
MIB = 1024 * 1024


@dataclass
class LoadPlan:
    """One load under way: decided on the engine thread, run on the loader thread."""

    ref: ModelRef
    device: str
    dtype: str
    requested_by: str
    started: float = field(default_factory=time.monotonic)

    held: Callable[[str], bool] | None = None  # whether the worker holds a model (an adapter's base)
    options: Callable[[ModelRef], LoadOptions] = lambda ref: LoadOptions()  # a model's (and an adapter's base's)

    speculative: SpeculativeConfig | None = None  # the model's speculative decoding (a draft model loads with it)

    def load(self, progress: Progress | None = None) -> LoadedModel | adapters.AdapterFiles:
        """A model, or a LoRA adapter's files (with its base, loaded here only if the worker lacks it)."""
        found = adapters.adapter_base(self.ref)
        if found is None:
            options = self.options(self.ref)
            if options.tensor_parallel_size > 1:
                return load_split(self.ref, self.device, self.dtype, progress, options)
            loaded = load_model(self.ref, self.device, self.dtype, progress, options)
            config = self.speculative
            if config is not None and config.method == "draft_model" and loaded.kind == "causal":
                loaded.draft = self._draft(loaded, config)
                if loaded.draft is not loaded:  # the worker's memory budget sees the pair
                    loaded.memory_bytes += loaded.draft.memory_bytes
            return loaded
        folder, base = found
        if self.options(base).tensor_parallel_size > 1:
            raise ModelLoadError(f"The LoRA adapter `{self.ref.key}` cannot be served: its base `{base.key}` is split "
                                 "over several ranks (tensor parallel), which serves no adapters.")
        files = adapters.AdapterFiles(self.ref, folder, base)
        if self.held is None or not self.held(base.key):
            files.base_loaded = load_model(base, self.device, self.dtype, progress, self.options(base))
        return files

    def _draft(self, loaded: LoadedModel, config: SpeculativeConfig) -> LoadedModel:
        """The draft model beside the target (the target itself when it names itself), with the same tokenizer."""
        from workers.engine.speculation.draft import check_same_tokenizer

        ref = ModelRef.parse(config.model)
        if ref.key == self.ref.key:
            return loaded
        try:
            draft = load_model(ref, self.device, self.dtype, None, self.options(ref))
        except Exception as exc:
            raise ModelLoadError(f"speculative decoding: the draft model {config.model} for {self.ref.key} did not "
                                 f"load: {exc}") from exc
        check_same_tokenizer(loaded, draft)
        return draft

    @property
    def name(self) -> str:
        """The model's key in every map (`ModelRef.key`)."""
        return self.ref.key


class ModelManager:
    def __init__(self, device: str, dtype: str, default_timeout: float, budget_bytes: int | None,
                 on_event: OnEvent | None = None, runner_settings: RunnerSettings = RunnerSettings(),
                 load_defaults: LoadOptions = LoadOptions()) -> None:
        self.device = device
        self.load_defaults = load_defaults  # the server's quantization and attention, where a model sets none
        self.dtype = dtype
        self.runner_settings = runner_settings
        self.default_timeout = default_timeout
        self.budget_bytes = budget_bytes if budget_bytes and budget_bytes > 0 else None
        self.on_event = on_event or (lambda event: None)
        self.models: dict[str, LoadedModel] = {}
        self.runners: dict[str, ModelRunner] = {}
        self.settings: dict[str, dict] = {}  # by repo id, from the catalog
        self._file_defaults: dict[str, tuple[dict, str | None]] = {}
        self._snapshot: dict[str, dict] = {}

    # --- read from any thread ----------------------------------------------
    def snapshot(self) -> dict[str, dict]:
        """{name: {"memory_bytes", "last_used" (epoch seconds), "max_model_len" (the context it serves: its
        KV cache budget may cap it)}}, replaced whole on every change."""
        return self._snapshot

    def _publish(self) -> None:
        offset = time.time() - time.monotonic()
        self._snapshot = {name: {"memory_bytes": m.memory_bytes, "last_used": m.last_used + offset,
                                 "max_model_len": m.max_model_len} for name, m in self.models.items()}

    # --- settings --------------------------------------------------------------
    def _settings(self, repo_id: str) -> dict:
        return self.settings.get(repo_id, {})

    def configure(self, settings: dict[str, dict]) -> None:
        """Replace every model's settings; loaded models take new defaults and templates at once."""
        self.settings = dict(settings)
        for name, loaded in self.models.items():
            self._apply(name, loaded)

    def _apply(self, name: str, loaded: LoadedModel) -> None:
        file_defaults, file_template = self._file_defaults.setdefault(
            name, (dict(loaded.generation_defaults), getattr(loaded.tokenizer, "chat_template", None)))
        own = self._settings(loaded.model_id)
        extra = {k: v for k, v in (own.get("generation_defaults") or {}).items() if k in MODEL_DEFAULT_KEYS}
        loaded.generation_defaults = {**file_defaults, **extra}
        loaded.default_stop = list((own.get("generation_defaults") or {}).get("stop") or [])
        loaded.tokenizer.chat_template = own.get("chat_template") or file_template
        if loaded.kind in ("causal", "image_text", "audio_text"):
            loaded.output_format = self._output_format(loaded, own)

    @staticmethod
    def _output_format(loaded: LoadedModel, own: dict) -> OutputFormat:
        """Its parsers: the catalog's overrides over what its files say (an unknown name is logged, not used)."""
        model_type = model_type_of(loaded.model)
        try:
            return output_format(loaded.tokenizer, model_type, own.get("tool_parser") or "",
                                 own.get("reasoning_parser") or "")
        except ValueError as exc:
            logger.warning("%s: %s; using the parsers its files point to", loaded.model_id, exc)
            return output_format(loaded.tokenizer, model_type)

    def idle_timeout(self, name: str) -> float:
        value = self._settings(self.models[name].model_id).get("idle_timeout")
        return self.default_timeout if value is None else float(value)

    def load_options(self, ref: ModelRef) -> LoadOptions:
        """A model's catalog settings over the server's defaults (trust_remote_code only ever per model)."""
        own = self._settings(ref.repo_id)
        return LoadOptions(quantization=own.get("quantization") or self.load_defaults.quantization,
                           trust_remote_code=bool(own.get("trust_remote_code")),
                           attn_implementation=own.get("attn_implementation") or self.load_defaults.attn_implementation,
                           gguf_file=own.get("gguf_file") or "", max_model_len=self.load_defaults.max_model_len,
                           generation_config=self.load_defaults.generation_config,
                           tensor_parallel_size=int(own.get("tensor_parallel_size") or 0)
                           or self.load_defaults.tensor_parallel_size)

    def runner_settings_for(self, repo_id: str) -> RunnerSettings:
        """The server's runner settings with the model's own speculative decoding and KV cache budget where its
        catalog row sets them (checked when the row was saved; a value that no longer parses keeps the
        server's, logged)."""
        own = self._settings(repo_id)
        settings = self.runner_settings
        kv_cache_memory = own.get("kv_cache_memory") or ""
        if kv_cache_memory:
            try:
                settings = replace(settings, kv_budget=replace(settings.kv_budget,
                                                               model_bytes=parse_bytes(kv_cache_memory)))
            except ValueError as exc:
                logger.warning("%s: kv_cache_memory %r: %s; the server's", repo_id, kv_cache_memory, exc)
        speculative = own.get("speculative_config") or ""
        try:
            return replace(settings, speculative=model_speculative_config(speculative, settings.speculative))
        except ValueError as exc:
            logger.warning("%s: speculative_config %r: %s; the server's", repo_id, speculative, exc)
            return settings

    def pinned(self, name: str) -> bool:
        return bool(self._settings(self.models[name].model_id).get("preload"))

    # --- load / unload -------------------------------------------------------
    def use(self, name: str) -> LoadedModel:
        """A loaded model, marked used now."""
        loaded = self.models[name]
        loaded.last_used = time.monotonic()
        self._publish()
        return loaded

    def begin_load(self, ref: ModelRef, busy: set[str], requested_by: str) -> LoadPlan:
        """What loading `name` takes, decided on the engine thread: room made (idle models evicted
        if the budget needs it), the load announced. The load itself is `plan.load(progress)`."""
        name = ref.key
        own = self._settings(ref.repo_id)
        dtype = own.get("dtype") if own.get("dtype") not in (None, "", "auto") else self.dtype
        plan = LoadPlan(ref, own.get("device") or self.device, dtype, requested_by)
        plan.held = lambda key: key in self.models
        plan.options = self.load_options
        plan.speculative = self.runner_settings_for(ref.repo_id).speculative
        self.on_event({"type": protocol.MODEL_LOADING, "model": name, "requested_by": requested_by})
        try:
            self._make_room(ref, busy)
            if self.load_options(ref).tensor_parallel_size > 1:
                self._make_room_for_split(name, busy)
        except ModelLoadError as exc:
            self.fail_load(plan, exc)
            raise
        return plan

    def finish_load(self, plan: LoadPlan, loaded: LoadedModel | adapters.AdapterFiles) -> LoadedModel:
        """Install a model loaded off the engine thread (called on the engine thread); an adapter is
        injected into its base here, between steps (its base installed first if it came with it)."""
        if isinstance(loaded, adapters.AdapterFiles):
            files = loaded
            if files.base.key not in self.models:
                if files.base_loaded is None:
                    raise ModelLoadError(f"The base model `{files.base.key}` of `{plan.name}` was unloaded meanwhile.")
                base_plan = LoadPlan(files.base, plan.device, plan.dtype, f"adapter:{plan.name}")
                self.on_event({"type": protocol.MODEL_LOADING, "model": files.base.key, "requested_by": base_plan.requested_by})
                self.finish_load(base_plan, files.base_loaded)
            loaded = adapters.attach(self.models[files.base.key], files)
        elif plan.name in self.models:  # installed meanwhile with an adapter that brought it: keep that one
            loaded = self.models[plan.name]  # (its runner may hold rows already; a second copy would orphan them)
            self.on_event(loaded_event(plan, loaded))
            return loaded
        if loaded.kind not in ("embedding", "cross_encoder") and loaded.adapter is None:
            # embeddings and cross-encoders: no KV cache; adapters: the base's runner. Built before the model is
            # installed: a model its runner refuses at load (workers/engine/execution/kv/specs.py) is not served.
            self.runners[plan.name] = runner_for(loaded, self.runner_settings_for(plan.ref.repo_id))
        self.models[plan.name] = loaded
        # Everything alive now (the libraries, this model's modules) leaves the collector's sight:
        # a full collection scans ~450k objects with the GIL held (~170 ms on CPU, a stall of every
        # stream); after freezing, only what is new.
        gc.freeze()
        self._apply(plan.name, loaded)
        loaded.last_used = time.monotonic()
        self._publish()
        self.on_event(loaded_event(plan, loaded))
        return loaded

    def fail_load(self, plan: LoadPlan, exc: Exception) -> None:
        self.on_event({"type": protocol.MODEL_LOAD_FAILED, "model": plan.name, "requested_by": plan.requested_by,
                       "duration_s": time.monotonic() - plan.started, "error": str(exc)})

    def touch(self, name: str) -> None:
        loaded = self.models.get(name)
        if loaded is not None:
            loaded.last_used = time.monotonic()

    def used_bytes(self) -> int:
        return sum(m.memory_bytes for m in self.models.values())

    def _make_room(self, ref: ModelRef, busy: set[str]) -> None:
        """Unload least recently used idle models until `name` fits the budget; else refuse."""
        if self.budget_bytes is None:
            return
        name = ref.key
        need = estimate_bytes(ref) or 0
        if need > self.budget_bytes:
            raise MemoryBudgetError(
                f"The model `{name}` needs about {need / MIB:.1f} MiB, more than this worker's memory budget "
                f"of {self.budget_bytes / MIB:.1f} MiB.")
        while self.used_bytes() + need > self.budget_bytes:
            idle = [n for n in self.models if n not in busy and not self.pinned(n)]
            if not idle:
                held = ", ".join(sorted(self.models)) or "none"
                raise MemoryBudgetError(
                    f"Not enough memory to load `{name}` (about {need / MIB:.1f} MiB): this worker's budget of "
                    f"{self.budget_bytes / MIB:.1f} MiB is held by models in use or preloaded ({held}). "
                    "Retry when they are idle, or unload one.")
            victim = min(idle, key=lambda n: self.models[n].last_used)
            self.unload(victim, busy, requested_by=f"evict:{name}")

    @property
    def split(self) -> bool:
        """Whether a model here is split over tensor-parallel ranks."""
        return any(loaded.parallel is not None for loaded in self.models.values())

    def broken(self) -> list[tuple[str, str]]:
        """The models split over ranks whose group is down, with why (the engine reloads them)."""
        return [(name, why) for name, loaded in self.models.items() if loaded.parallel is not None
                and (why := self.runners[name].problem()) is not None]

    def _make_room_for_split(self, name: str, busy: set[str]) -> None:
        """A worker process joins one tensor-parallel group at a time: a split model idle here makes way."""
        for other in [n for n, m in self.models.items() if m.parallel is not None and n != name]:
            if other in busy or self.pinned(other):
                raise ModelLoadError(f"The model `{name}` cannot be split over ranks now: this worker's tensor-parallel "
                                     f"group serves `{other}`, which is {'in use' if other in busy else 'preloaded'} "
                                     "(one split model per worker; start another worker for a second).")
            self.unload(other, busy, requested_by=f"evict:{name}")

    def unload(self, name: str, busy: set[str], requested_by: str, error: str = "") -> bool:
        """Unload now; refuses (ModelBusyError) while sequences of the model run or wait. False if not loaded."""
        if name not in self.models:
            return False
        if name in busy:
            raise ModelBusyError(f"The model `{name}` is generating; unload it when its requests finish.")
        for adapter in [n for n, m in self.models.items() if m.base_key == name]:  # a base goes with its adapters
            self.unload(adapter, busy, requested_by=f"base:{requested_by}")
        started = time.monotonic()
        loaded = self.models.pop(name)
        if loaded.base_key is not None and loaded.base_key in self.models:
            adapters.detach(self.models[loaded.base_key], loaded)
        self.runners.pop(name, None)
        self._file_defaults.pop(name, None)
        if loaded.parallel is not None:
            loaded.parallel.close()
        device = loaded.device
        model = weakref.ref(loaded.model)
        del loaded
        if model() is not None:  # kept by a reference cycle: only a full collection frees its weights
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        self._publish()
        logger.info("unloaded %s (%s)", name, requested_by)
        self.on_event({"type": protocol.MODEL_UNLOADED, "model": name, "requested_by": requested_by,
                       "duration_s": time.monotonic() - started, **({"error": error} if error else {})})
        return True

    def unload_idle(self, busy: set[str]) -> None:
        """Models idle past their timeout go (never preloaded ones, never with timeout -1)."""
        now = time.monotonic()
        for name in list(self.models):
            timeout = self.idle_timeout(name)
            if name in busy or self.pinned(name) or timeout < 0:
                continue
            if now - self.models[name].last_used >= timeout:
                self.unload(name, busy, requested_by="idle")


def loaded_event(plan: LoadPlan, loaded: LoadedModel) -> protocol.ModelChange:
    """The catalog's record of a finished load: how long it took, what it holds, the context it serves."""
    return {"type": protocol.MODEL_LOADED, "model": plan.name, "requested_by": plan.requested_by,
            "duration_s": time.monotonic() - plan.started, "memory_bytes": loaded.memory_bytes,
            "max_model_len": loaded.max_model_len}
