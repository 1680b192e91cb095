"""The model catalog: what the cache holds, how an admin wants each model served, where it runs.

Rows are written by `catalog.services` (scans, admin changes) and by workers (heartbeats,
load events). Models deleted from disk are marked `gone`, never dropped, so their settings
and history survive a re-download.
"""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from protocol import MODEL_SAMPLING_KEYS
from protocol.output_formats import canonical
from protocol.gguf import choose_gguf_file
from protocol.sizes import parse_bytes
from protocol.load_options import ATTN_IMPLEMENTATIONS, QUANTIZATIONS, check_attn_implementation
from protocol.speculative import OFF, parse_speculative_config

# What an admin may set in a model's `generation_defaults`: the sampling knobs a worker also takes
# from generation_config.json, and stop strings.
GENERATION_DEFAULT_KEYS = (*MODEL_SAMPLING_KEYS, "stop")


class CachedModel(models.Model):
    class DType(models.TextChoices):
        AUTO = "auto"
        CHECKPOINT = "checkpoint"  # the dtype it was saved in
        FLOAT32 = "float32"
        FLOAT16 = "float16"
        BFLOAT16 = "bfloat16"
        FLOAT64 = "float64"

    # What the cache scan found.
    repo_id = models.CharField(max_length=300, unique=True)
    revision = models.CharField(max_length=64, blank=True, help_text="commit the `main` ref (or newest) points to")
    revisions = models.JSONField(default=list, blank=True, help_text="every cached commit")
    size_on_disk = models.BigIntegerField(default=0)
    architectures = models.JSONField(default=list, blank=True)
    is_causal_lm = models.BooleanField(default=False)
    modalities = models.JSONField(default=list, blank=True,
                                  help_text="what it takes as input (text, image, audio, video); empty: not served")
    last_modified = models.DateTimeField(null=True, blank=True)
    last_scanned = models.DateTimeField(null=True, blank=True)
    gone = models.BooleanField(default=False, help_text="no longer in the cache (kept for its settings and history)")
    gguf_files = models.JSONField(
        default=list, blank=True, help_text="a GGUF model's files and their quantization types: [[file, type], …]")

    # What an admin decides.
    enabled = models.BooleanField(default=True)
    aliases = models.JSONField(default=list, blank=True, help_text='other names clients may send as `model`, e.g. ["tiny"]')
    idle_timeout = models.IntegerField(
        null=True, blank=True,
        help_text="seconds idle before a worker unloads it; empty: the server default; -1: never")
    preload = models.BooleanField(default=False, help_text="load when a worker starts; never unloaded for idleness")
    dtype = models.CharField(max_length=16, choices=DType.choices, default=DType.AUTO)
    device = models.CharField(max_length=32, blank=True, help_text="e.g. cuda:1; empty: the worker's default")
    chat_template = models.TextField(blank=True, help_text="Jinja template used instead of the model's own")
    generation_defaults = models.JSONField(
        default=dict, blank=True,
        help_text="sampling defaults over generation_config.json; the request still wins")
    tool_parser = models.CharField(
        max_length=32, blank=True,
        help_text="vLLM's --tool-call-parser name (hermes, llama3_json, mistral, openai, …); empty: what its files say")
    reasoning_parser = models.CharField(
        max_length=32, blank=True,
        help_text="vLLM's --reasoning-parser name (qwen3, deepseek_r1, mistral, …, none); empty: what its files say")
    detected_parsers = models.JSONField(
        default=dict, blank=True, help_text="what the cache scan found: {tool_parser, reasoning_parser, source}")
    quantization = models.CharField(
        max_length=32, blank=True, choices=[(q, q) for q in QUANTIZATIONS],
        help_text="quantize on load (bnb-*: CUDA only); empty: the server default (a checkpoint saved "
                  "quantized loads as it is)")
    trust_remote_code = models.BooleanField(
        default=False, help_text="let the repo's own Python files (auto_map in config.json) run on the workers: "
                                 "only for repos you trust")
    attn_implementation = models.CharField(
        max_length=100, blank=True,
        help_text=f"transformers' attention kernel: {', '.join(ATTN_IMPLEMENTATIONS)}; empty: the server default")
    gguf_file = models.CharField(
        max_length=255, blank=True,
        help_text="a GGUF model: the file it serves (a name from its GGUF files, or a quantization type such as "
                  "Q4_K_M); empty: the only one, else the Q4_K_M one, else the first")
    speculative_config = models.CharField(
        max_length=500, blank=True,
        help_text='speculative decoding for this model, vLLM\'s JSON: {"method": "ngram", "num_speculative_tokens": 5, '
                  '"prompt_lookup_max": 4, "prompt_lookup_min": 2}; "off": none; empty: the server\'s '
                  '(--speculative-config)')
    tensor_parallel_size = models.PositiveSmallIntegerField(
        default=0, help_text="split the model over N devices (N GPUs over NCCL, or N CPU processes over gloo; vLLM's "
                             "--tensor-parallel-size); 0: the server default (--tensor-parallel-size, else 1)")
    kv_cache_memory = models.CharField(
        max_length=32, blank=True,
        help_text="this model's KV cache budget: 8G, 8GiB, 512MB or bytes (vLLM's --kv-cache-memory-bytes, for this "
                  "model alone; from its next load); its context is capped to what it holds; empty: the server's "
                  "(--kv-cache-memory, --gpu-memory-utilization, else a share of free memory)")

    class Meta:
        ordering = ["repo_id"]
        verbose_name = "model"

    def __str__(self) -> str:
        return self.repo_id

    def clean(self) -> None:
        """What the admin form accepts: aliases as a list of names, known numeric sampling defaults, known parsers."""
        for field, kind in (("tool_parser", "tool"), ("reasoning_parser", "reasoning")):
            try:
                canonical(getattr(self, field), kind)
            except ValueError as exc:
                raise ValidationError({field: str(exc)}) from None
        if not isinstance(self.aliases, list) or not all(isinstance(a, str) and a.strip() for a in self.aliases):
            raise ValidationError({"aliases": 'A JSON list of names, e.g. ["tiny"].'})
        if self.gguf_file:
            try:
                choose_gguf_file([str(f[0]) for f in self.gguf_files or ()], self.gguf_file)
            except ValueError as exc:
                raise ValidationError({"gguf_file": f"This model {exc}." if self.gguf_files else
                                       "Only a GGUF model (a repo of .gguf files) has a GGUF file to choose."}) from None
        try:
            check_attn_implementation(self.attn_implementation)
        except ValueError as exc:
            raise ValidationError({"attn_implementation": str(exc)}) from None
        if self.speculative_config.strip().lower() != OFF:
            try:
                parse_speculative_config(self.speculative_config)
            except ValueError as exc:
                raise ValidationError({"speculative_config": str(exc)}) from None
        if self.kv_cache_memory.strip():
            self.kv_cache_memory = str(self.kv_cache_memory).strip()
            try:
                size = parse_bytes(self.kv_cache_memory)
            except ValueError as exc:
                raise ValidationError({"kv_cache_memory": f"{exc}."}) from None
            if size <= 0:
                raise ValidationError({"kv_cache_memory": "A KV cache budget of more than 0 bytes (e.g. 8G, 512MiB)."})
        defaults = self.generation_defaults
        if not isinstance(defaults, dict):
            raise ValidationError({"generation_defaults": 'A JSON object, e.g. {"temperature": 0.7}.'})
        for key, value in defaults.items():
            if key not in GENERATION_DEFAULT_KEYS:
                raise ValidationError({"generation_defaults": f"Unknown key {key!r}; one of {', '.join(GENERATION_DEFAULT_KEYS)}."})
            if key == "stop":
                if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
                    raise ValidationError({"generation_defaults": "stop must be a list of non-empty strings."})
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValidationError({"generation_defaults": f"{key} must be a number."})


class Worker(models.Model):
    class Status(models.TextChoices):
        ONLINE = "online"
        LOST = "lost"
        STOPPED = "stopped"

    name = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    channel_name = models.CharField(max_length=200, blank=True, help_text="this worker's own channel")
    device = models.CharField(max_length=64, blank=True)
    memory_total_mb = models.FloatField(null=True, blank=True, help_text="the memory budget, else the device's")
    memory_used_mb = models.FloatField(default=0.0, help_text="held by loaded models")
    free_slots = models.IntegerField(null=True, blank=True, help_text="jobs it could still admit, at its last heartbeat")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ONLINE)
    started_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelLoad(models.Model):
    """One model on one worker."""

    class Status(models.TextChoices):
        LOADING = "loading"
        LOADED = "loaded"
        ERROR = "error"
        UNLOADED = "unloaded"

    model = models.ForeignKey(CachedModel, on_delete=models.CASCADE, related_name="loads")
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="loads")
    status = models.CharField(max_length=16, choices=Status.choices)
    memory_mb = models.FloatField(default=0.0)
    max_model_len = models.IntegerField(null=True, blank=True,
                                        help_text="the context it serves here (its KV cache budget may cap the model's)")
    error = models.TextField(blank=True)
    loaded_at = models.DateTimeField(null=True, blank=True)
    last_used = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Its recent requests here (workers/adapter/model_health.py), cleared when it is unloaded or loaded again.
    degraded = models.BooleanField(default=False, help_text="most of its recent requests on this worker failed")
    recent_failed = models.IntegerField(default=0, help_text="failed of its last `recent_jobs` requests")
    recent_jobs = models.IntegerField(default=0, help_text="its last requests counted (at most 10)")
    last_error = models.TextField(blank=True, help_text="the last error a request of it ended with")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "worker"], name="one_load_per_model_and_worker")]

    def __str__(self) -> str:
        return f"{self.model} on {self.worker}: {self.status}"


class LoadEvent(models.Model):
    """Every load and unload, with who asked: the history behind `ModelLoad`."""

    class Action(models.TextChoices):
        LOAD = "load"
        UNLOAD = "unload"

    model_name = models.CharField(max_length=300, help_text="as the worker knew it: repo@revision")
    model = models.ForeignKey(CachedModel, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    worker = models.ForeignKey(Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    action = models.CharField(max_length=16, choices=Action.choices)
    requested_by = models.CharField(max_length=200, blank=True, help_text="request, preload, idle, evict, admin:<user>…")
    at = models.DateTimeField(auto_now_add=True)
    duration_s = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.action} {self.model_name} ({self.requested_by})"
