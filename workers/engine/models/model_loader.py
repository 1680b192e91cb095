"""Loading a model and its tokenizer (and processor, for media) from the Hugging Face cache (or the hub, online).

The class follows `protocol.modalities.model_kind`: a causal LM, a vision-language model
(`AutoModelForImageTextToText` + its `AutoProcessor`), an audio-language model
or an omni model taking images and audio (`AutoModelForMultimodalLM` + its `AutoProcessor`), or a speech-to-text model
(`AutoModelForSpeechSeq2Seq` + its processor, for /v1/audio).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import cached_file

from workers.engine.errors import ModelLoadError
from workers.engine.models.gguf_loading import find_gguf, gguf_bytes, gguf_model_fields
from workers.engine.models.load_progress import (DOWNLOAD_EVENT_SECONDS, Progress, bytes_progress,  # noqa: F401 (theirs)
                                                 download, weights_progress)
from workers.engine.models.processors import load_processor
from workers.engine.models.tensor_parallel_plan import refuse_tensor_parallel, tensor_parallel_kwargs
from protocol.hub import hub_reachable
from protocol.context_length import context_length
from protocol.dtypes import canonical_dtype
from protocol.load_options import check_attn_implementation
from protocol.modalities import Kind, input_modalities, model_kind
from protocol import ModelRef
from workers.engine.models.quantization import (quant_method, quantization_config, release_checkpoint_map, tensor_bytes,
                                         unannounced_quantized_type)
from workers.engine.sample.sampling import MODEL_DEFAULT_KEYS

logger = logging.getLogger(__name__)

# progress(stage, {"current", "total"} | None): the load stages of /load_model, in order.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _model_class(kind: Kind):
    """Imported on first use: the media classes cost seconds of import a text-only worker never needs."""
    if kind == "image_text":
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText
    if kind in ("audio_text", "omni"):
        from transformers import AutoModelForMultimodalLM

        return AutoModelForMultimodalLM
    if kind == "speech":
        from transformers import AutoModelForSpeechSeq2Seq

        return AutoModelForSpeechSeq2Seq
    if kind == "embedding":  # the base model, hidden states out (a causal LM without its head)
        from transformers import AutoModel

        return AutoModel
    if kind == "cross_encoder":  # logits per text pair
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification
    return AutoModelForCausalLM


def _class_for(kind: Kind, config: Any):
    """The auto class for `kind`, or the class the config's `architectures` names where the auto class does not
    map that config (a text-only half saved on its own, e.g. `MllamaForCausalLM`, whose text config transformers'
    auto classes know only inside the whole model's)."""
    import transformers

    auto_class = _model_class(kind)
    architectures = getattr(config, "architectures", None) or []
    named = getattr(transformers, architectures[0], None) if architectures else None
    if type(config) in auto_class._model_mapping or not isinstance(named, type) or getattr(config, "auto_map", None):
        return auto_class  # the auto class knows the config, or the repo's own code is asked for
    return named


@dataclass(frozen=True)
class LoadOptions:
    """What a load asks of transformers beyond device and dtype (protocol.load_options names the choices)."""

    quantization: str = ""  # "": none asked (a checkpoint saved quantized still loads quantized)
    trust_remote_code: bool = False  # run the repo's own modeling code (its config's auto_map)
    attn_implementation: str = ""  # "": the model's default
    gguf_file: str = ""  # a GGUF model's file chosen in the catalog (protocol/gguf.py); "": its default one
    max_model_len: int = 0  # the server's cap on the context (vLLM's --max-model-len); 0: the model's own
    generation_config: str = "auto"  # sampling defaults from: auto (generation_config.json), vllm (none), a folder
    tensor_parallel_size: int = 1  # ranks the model is split over (workers/engine/parallel/); 1: one device


@dataclass
class LoadedModel:
    model_id: str
    revision: str
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    max_model_len: int
    eos_token_ids: list[int]
    context_capped_by: str = ""  # max_model_len is what its KV cache budget holds, as this setting made it (kv/budget.py)
    generation_defaults: dict = field(default_factory=dict)
    default_stop: list[str] = field(default_factory=list)  # the catalog's, where a request sends no `stop`
    last_used: float = field(default_factory=time.monotonic)
    memory_bytes: int = 0
    kind: Kind = "causal"
    processor: Any = None  # the AutoProcessor of a model that takes media; None for text-only models
    pooling: Any = None  # an embedding model's workers.engine.models.pooling.Pooling
    classifier: Any = None  # a cross-encoder's workers.engine.models.pooling.Classifier
    adapter: str | None = None  # a LoRA adapter's peft name (workers.engine.models.adapters); its modules are its base's
    base_key: str | None = None  # an adapter's base model key: its requests run in the base's runner
    peft: Any = None  # a base model with adapters: the PeftModel around `model` (forwards with adapter_names)
    output_format: Any = None  # workers.engine.output.parsing.OutputFormat: how its answers are parsed (set by the manager)
    draft: Any = None  # speculative decoding's draft model (a LoadedModel with the same tokenizer), if configured
    parallel: Any = None  # its workers.engine.parallel.group.TensorParallelGroup when split over several ranks
    quantization: str = ""  # how its weights are held: "" (not quantized), a protocol.load_options name, or the
    # checkpoint's own quant_method (e.g. "torchao")

    @property
    def modalities(self) -> tuple[str, ...]:
        # a media model served without its processor (a repo that ships none) takes text only
        return input_modalities(self.kind if self.processor is not None else "causal")

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])


def resolve_device(requested: str) -> torch.device:
    if requested and requested != "auto":
        return torch.device(requested)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def set_attention_backends(device: torch.device, cudnn: bool) -> None:
    """On CUDA, torch's SDPA may pick cuDNN's attention, which on an H100 spent 1.4-2.0 ms of CPU per
    decode-step call for ~10 us of GPU work (half the server's CPU, issue 22's profile); off unless
    asked for, SDPA takes its flash or memory-efficient kernels. Nothing changes on other devices."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(cudnn)


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype | str:
    """`auto`: bf16 where the GPU supports it, fp16 on older GPUs, fp32 on CPU; `checkpoint`: transformers' "auto"
    (the saved dtype); else a name or alias (protocol.dtypes)."""
    name = canonical_dtype(requested)
    if name == "checkpoint":
        return "auto"
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def _generation_defaults(repo_id: str, revision: str, source: str = "auto") -> tuple[dict, list[int]]:
    """Sampling defaults and EOS ids the model's generation_config.json declares, verbatim; vLLM's
    --generation-config: "vllm" keeps the EOS ids but no sampling defaults, a folder's file replaces the model's."""
    if source not in ("auto", "vllm"):
        own_defaults, eos_ids = _generation_defaults(repo_id, revision)
        path = Path(source).expanduser() / "generation_config.json"
        if not path.is_file():
            return own_defaults, eos_ids
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return own_defaults, eos_ids
        return {key: raw[key] for key in MODEL_DEFAULT_KEYS if raw.get(key) is not None}, eos_ids
    path = cached_file(repo_id, "generation_config.json", revision=revision, local_files_only=True,
                       _raise_exceptions_for_missing_entries=False)
    if not path:
        return {}, []
    try:
        raw = json.loads(open(path).read())
    except (OSError, ValueError):
        return {}, []
    eos = raw.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else [int(e) for e in eos or []]
    if source == "vllm":
        return {}, eos_ids
    return {key: raw[key] for key in MODEL_DEFAULT_KEYS if raw.get(key) is not None}, eos_ids


def _max_model_len(repo_id: str, revision: str, tokenizer: PreTrainedTokenizerBase) -> int:
    """protocol.context_length over the repo's config.json as saved (not the loaded config, whose classes fill
    in defaults the file lacks): what /v1/models reads from the same files."""
    path = cached_file(repo_id, "config.json", revision=revision, local_files_only=True,
                       _raise_exceptions_for_missing_entries=False)
    try:
        raw = json.loads(Path(path).read_text()) if path else {}
    except (OSError, ValueError):
        raw = {}
    return context_length(raw if isinstance(raw, dict) else {}, getattr(tokenizer, "model_max_length", None))


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes the model's parameters and buffers hold, wherever they live (a quantized weight: its packed data)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(tensor_bytes(t) for t in tensors)


def estimate_bytes(ref: ModelRef) -> int | None:
    """Weight bytes on disk for a cached model (what loading it will roughly take); None if not cached."""
    repo_id, revision = ref.repo_id, ref.branch
    if ":" in repo_id:  # `repo:FILE`: a GGUF file (protocol/gguf.py)
        return gguf_bytes(ref)
    config = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if not isinstance(config, str):
        return gguf_bytes(ref)  # a GGUF model's file, else None
    snapshot = Path(config).parent
    return sum(f.stat().st_size for f in snapshot.rglob("*") if f.name.endswith(WEIGHT_SUFFIXES) and f.is_file())


def _remote_code_refused(repo_id: str, exc: Exception) -> ModelLoadError | None:
    """transformers' refusal of a repo that carries its own code, said as what an admin can do about it."""
    if "trust_remote_code" not in str(exc):
        return None
    return ModelLoadError(
        f"The model `{repo_id}` carries its own Python code (auto_map in its config.json), which this server does "
        "not run unless told to: an admin enables trust_remote_code on the model (catalog admin or a config file's "
        "models: entry), or serve it pinned with `serve MODEL --trust-remote-code`. That runs the repo's code on "
        "the workers: only for repos you trust.")


def _local_first(loader, repo_id: str, **kwargs):
    try:  # what the cache holds loads without touching the network
        return loader(repo_id, local_files_only=True, **kwargs)
    except OSError:
        if not hub_reachable():  # never into huggingface_hub's minute of retries
            revision = kwargs.get("revision")
            what = f"revision `{revision}` of `{repo_id}`" if revision and revision != "main" else f"`{repo_id}`"
            raise OSError(f"{what} is not in the cache and the hub is not reachable") from None
        return loader(repo_id, **kwargs)


def _processor_or_text_only(key: str, kind: str, repo_id: str, **kwargs) -> tuple[Any, Any]:
    """A media model's processor and its tokenizer; a repo that ships no processor (only a tokenizer: a
    checkpoint saved without its preprocessor files) is served as text only, said once in the log."""
    from transformers import AutoTokenizer

    try:
        processor = _local_first(load_processor, repo_id, **kwargs)
        return processor, processor.tokenizer
    except OSError:
        if kind == "speech":
            raise
        tokenizer = _local_first(AutoTokenizer.from_pretrained, repo_id, **kwargs)
    logger.warning("%s: the repo has no processor for its media (no preprocessor_config.json); it is served "
                   "as text only, and a request with an image, audio or video gets a 400", key)
    return None, tokenizer


def load_model(ref: ModelRef, device: str = "auto", dtype: str = "auto", progress: Progress | None = None,
               options: LoadOptions = LoadOptions()) -> LoadedModel:
    """Load `repo[@revision]` through the stages processor, config, download (if not cached), weights."""
    report: Progress = progress or (lambda stage, value=None: None)
    repo_id, revision = ref.repo_id, ref.branch
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    started = time.monotonic()
    # always said: left out, transformers asks on stdin whether to run a repo's code
    remote = {"trust_remote_code": options.trust_remote_code}
    if options.trust_remote_code:
        logger.warning("loading %s with trust_remote_code: the repo's own Python code runs in this worker", ref.key)
    try:
        check_attn_implementation(options.attn_implementation)
        # a GGUF model (`repo:FILE`, or a repo of .gguf files): loaded by workers/engine/models/gguf_loading.py
        gguf = find_gguf(ref, options.gguf_file)
        if gguf is not None and options.tensor_parallel_size > 1:
            refuse_tensor_parallel(ref.key, options.tensor_parallel_size, "GGUF files load through transformers' GGUF "
                                   "reader, which does not shard")
        if gguf is not None:
            fields = gguf_model_fields(ref, gguf, torch_device, torch_dtype, report, weights_progress,
                                       options.quantization, options.attn_implementation)
            if options.max_model_len:
                fields["max_model_len"] = min(fields["max_model_len"], options.max_model_len)
            return LoadedModel(**fields, memory_bytes=model_bytes(fields["model"]))
        quantize = quantization_config(options.quantization, torch_device) if options.quantization else None
        report("processor", None)
        config = _local_first(AutoConfig.from_pretrained, repo_id, revision=revision, **remote)  # says which processor
        modules = cached_file(repo_id, "modules.json", revision=revision, local_files_only=True,
                              _raise_exceptions_for_missing_entries=False)
        kind = model_kind(config.to_dict(), sentence_transformers=bool(modules)) or "causal"
        pooling = None
        if kind == "embedding":
            from workers.engine.models.pooling import read_pooling

            pooling = read_pooling(Path(modules).parent, config.to_dict())
        classifier = None
        if kind == "cross_encoder":
            from workers.engine.models.pooling import read_classifier

            classifier = read_classifier(config.to_dict())
        processor = None
        if kind in ("causal", "embedding", "cross_encoder"):
            tokenizer = _local_first(AutoTokenizer.from_pretrained, repo_id, revision=revision, **remote)
        else:  # PIL-backed image processors: the torchvision ones cannot run with this torch build
            processor, tokenizer = _processor_or_text_only(ref.key, kind, repo_id, revision=revision,
                                                           **remote)
        report("config", None)
        kwargs = dict(revision=revision, config=config, dtype=torch_dtype, **remote)
        if options.tensor_parallel_size > 1:  # the process group is joined already (workers/engine/parallel/group.py)
            kwargs.update(tensor_parallel_kwargs(ref.key, config, options.tensor_parallel_size, kind, torch_device,
                                                 options.quantization))
        if options.attn_implementation:
            kwargs["attn_implementation"] = options.attn_implementation
        saved_quantized = getattr(config, "quantization_config", None)
        unannounced = None if saved_quantized is not None else unannounced_quantized_type(repo_id, revision)
        if unannounced is not None:
            raise ModelLoadError(f"The model `{ref.key}`'s weights are saved quantized by torchao ({unannounced}) but "
                                 "its config.json has no quantization_config, so they would load as random weights. "
                                 "Add the quantization_config they were saved with (save_pretrained writes it).")
        if quantize is not None and saved_quantized is not None:
            raise ModelLoadError(f"The model `{ref.key}` is saved quantized already "
                                 f"({quant_method(saved_quantized)}); serve it without a quantization setting.")
        if quantize is not None:
            kwargs["quantization_config"] = quantize
        if quantize is not None or saved_quantized is not None:
            # quantized weights are placed as they load: a bitsandbytes model cannot be moved afterwards
            kwargs["device_map"] = {"": torch_device}
        model_class = _class_for(kind, config)
        try:
            with weights_progress(report):
                # transformers passes `local_files_only` on to everything but its look for a PEFT
                # adapter_config.json, which went to the hub (23 s of retries with no network)
                model = model_class.from_pretrained(repo_id, local_files_only=True,
                                                    adapter_kwargs={"local_files_only": True}, **kwargs)
        except OSError:
            download(repo_id, revision, report)
            with weights_progress(report):
                model = model_class.from_pretrained(repo_id, **kwargs)
    except OSError as exc:
        raise ModelLoadError(f"The model `{ref.key}` does not exist or could not be read: {exc}", not_found=True) from exc
    except (ValueError, KeyError, RuntimeError, ImportError) as exc:
        raise _remote_code_refused(ref.key, exc) or ModelLoadError(
            f"The model `{ref.key}` could not be loaded: {exc}") from exc
    if "device_map" not in kwargs and "distributed_config" not in kwargs:
        model.to(torch_device)
    elif torch_device.type == "cpu":
        release_checkpoint_map(model)
    model.eval()
    defaults, eos_ids = _generation_defaults(repo_id, revision, options.generation_config)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.append(tokenizer.eos_token_id)
    quantized = options.quantization or (quant_method(saved_quantized) if saved_quantized is not None else "")
    logger.info("loaded %s on %s as %s%s%s in %.1fs", ref.key, torch_device, getattr(model, "dtype", torch_dtype),
                f", quantized {quantized}" if quantized else "",
                f", attention {options.attn_implementation}" if options.attn_implementation else "",
                time.monotonic() - started)
    return LoadedModel(
        model_id=repo_id,
        revision=revision,
        model=model,
        tokenizer=tokenizer,
        device=torch_device,
        max_model_len=min(_max_model_len(repo_id, revision, tokenizer), (pooling and pooling.max_seq_length) or 10**9,
                          options.max_model_len or 10**9),
        eos_token_ids=eos_ids,
        generation_defaults=defaults,
        memory_bytes=model_bytes(model),
        kind=kind,
        processor=processor,
        pooling=pooling,
        classifier=classifier,
        quantization=quantized,
    )
