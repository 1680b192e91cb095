"""What an engine is told when it starts: device, batching limits, chat-template choices, media limits.

Plain Python. `inference_site/inference_settings.py` parses the environment into one EngineConfig
(`settings.INFERENCE.engine`) and the worker's adapter passes it down; nothing below the adapter reads
settings or the environment. Tests build their own (`EngineConfig(max_num_seqs=8)`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from protocol.speculative import SpeculativeConfig
from workers.media.limits import MIB, MediaSettings

# On 2 CPU cores a decode step takes about 2.6 ms for 1 row and 9 ms for 32 (tiny model), and a batch
# line's prefill is a whole extra forward: any batch work beside an interactive stream stretches its
# inter-token gaps (p99 1.8-3.3x with 2 rows), so on CPU batch work waits while interactive work runs.
BATCH_ROWS_BESIDE_INTERACTIVE_CPU = 0
# Prompt tokens one step may prefill (INFERENCE_PREFILL_CHUNK 0). On a GPU a forward of 8,192 tokens
# costs little more than one of 512 (vLLM's default batch of tokens is 8,192), so 64 prompts of ~130
# tokens are admitted in one step, not sixteen; on CPU a forward's time grows with its tokens.
PREFILL_CHUNK_GPU = 8192
PREFILL_CHUNK_CPU = 512


@dataclass(frozen=True)
class TemplateSettings:
    """Server-wide chat-template choices: `serve --chat-template FILE`, its kwargs (JSON), `--reasoning`."""

    path: str = ""
    kwargs_json: str = ""
    reasoning: str = "auto"


@dataclass(frozen=True)
class EngineConfig:
    device: str = "auto"
    dtype: str = "auto"
    torch_threads: int = 0  # 0: follow the cores other processes leave free (workers/engine/cpu_share.py)
    gil_switch_ms: float = 0.0  # the process's GIL switch interval while the engine runs; 0: Python's (5 ms)
    cudnn_attention: bool = False  # SDPA's cuDNN backend on CUDA (model_loader.set_attention_backends)
    quantization: str = ""  # every model's quantization on load where its catalog row sets none (protocol.load_options)
    attn_implementation: str = ""  # every model's attention kernel where its catalog row sets none; "": the model's
    max_num_seqs: int = 32  # 0: fit the device (`fitted`)
    max_model_len: int = 0  # caps every model's context (vLLM's --max-model-len); 0: each model's own
    tensor_parallel_size: int = 1  # ranks every model is split over where its catalog row sets none (vLLM's -tp)
    generation_config: str = "auto"  # vLLM's --generation-config: auto (the model's), vllm (none), or a folder
    seed: int | None = None  # vLLM's --seed: torch's global RNG seeded at start, so unseeded sampling repeats per run
    batch_rows_beside_interactive: int = -1  # rows batch work may hold while interactive work is here; -1: fit
    max_queue: int = 256
    prefill_chunk: int = 512  # 0: fit the device (`fitted`)
    prefill_share: float = 0.5  # prefill time per step while streams run, as a multiple of a decode step
    model_timeout: float = 300.0  # idle seconds before a model is unloaded
    memory_budget_bytes: int | None = None  # None: no budget
    grammar_timeout: float = 10.0  # seconds a structured-output grammar may take to compile
    grammar_cache_size: int = 64  # compiled grammars kept (LRU)
    kv_cache_bytes: int | None = None  # each model's KV cache budget (execution/kv/budget.py); None: a share of free memory
    gpu_memory_utilization: float | None = None  # vLLM's: the budget is what this share of the device leaves
    prefix_cache_bytes: int = 512 * MIB  # per model, for prompts that start like earlier ones; 0: off
    rows_apart_bytes: int | None = None  # what a long row apart must save (execution/kv/apart.py); None: auto, -1: never
    max_faults: int = 5  # engine-loop failures in a row before the engine is dead (workers/engine/core/supervision.py)
    stall_seconds: float = 60.0  # an engine loop silent this long is reported stalled by ping and /health
    embedding_batch: int = 32  # embedding inputs per batched forward, one forward per engine step
    stream_interval: int = 1  # new tokens a stream gathers before its next message (1: every token as it comes)
    static_decode: str = "auto"  # decode steps as one static program: "on", "off", "auto" (on with CUDA)
    cuda_graphs: bool = True  # static steps captured into CUDA graphs, one per bucket of rows (CUDA only)
    speculative: SpeculativeConfig | None = None  # vLLM's --speculative-config (n-gram lookup); None: off
    templates: TemplateSettings = field(default_factory=TemplateSettings)
    media: MediaSettings = field(default_factory=MediaSettings)

    def fitted(self, device_type: str) -> EngineConfig:
        """The device's defaults where the settings left the choice open (0, or -1): a GPU's step costs
        about the same for 1 row or 256, so it runs 256 sequences, and batch rows beside interactive ones
        cost those little (every slot); a CPU's grows with the rows, so 32, and batch rows beside
        interactive ones at most BATCH_ROWS_BESIDE_INTERACTIVE_CPU; a step prefills up to PREFILL_CHUNK_GPU or
        PREFILL_CHUNK_CPU prompt tokens."""
        gpu = device_type == "cuda"
        fitted = self if self.max_num_seqs > 0 else replace(self, max_num_seqs=256 if gpu else 32)
        if fitted.prefill_chunk <= 0:
            fitted = replace(fitted, prefill_chunk=PREFILL_CHUNK_GPU if gpu else PREFILL_CHUNK_CPU)
        if fitted.static_decode not in ("on", "off"):
            fitted = replace(fitted, static_decode="on" if gpu else "off")
        if fitted.batch_rows_beside_interactive < 0:
            fitted = replace(fitted, batch_rows_beside_interactive=fitted.max_num_seqs if gpu
                             else BATCH_ROWS_BESIDE_INTERACTIVE_CPU)
        return fitted
