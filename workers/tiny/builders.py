"""Offline builder for tiny causal LMs stored in a real Hugging Face hub cache.

Tests and local development need models that load through the normal
``from_pretrained("org/name")`` path with ``HF_HUB_OFFLINE=1`` and that
``huggingface_hub.scan_cache_dir()`` reports, without any network access.
This module trains a small byte-level BPE tokenizer on a corpus shipped with
the project, creates a randomly initialised Llama model with a fixed seed and
writes everything into ``{cache}/models--{org}--{name}/`` exactly the way
``huggingface_hub`` does (content-addressed blobs, relative symlinks in the
snapshot, ``refs/main`` holding the commit hash).

Plain Python on purpose: no Django imports, so it can run from scripts,
management commands and pytest alike.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast, ProcessorMixin

DATA_DIR = Path(__file__).resolve().parent / "data"
CORPUS_PATH = DATA_DIR / "tiny_corpus.txt"
CHAT_TEMPLATE_PATH = Path(__file__).resolve().parent / "chat_template.jinja"

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, IM_START, IM_END]
# Like Qwen3: added (never split) but not "special", so they survive
# ``decode(skip_special_tokens=True)`` and reasoning/tool parsers can see them.
EXTRA_ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

# A random model with the usual initializer_range=0.02 has nearly flat logits:
# greedy picks are decided by tiny margins. A ~5-10x larger init makes hidden
# states (and so greedy continuations) vary with the prompt, and scaling the
# lm_head afterwards sharpens the next-token distribution (median top-1 prob
# ~0.5-0.6, median top-1/top-2 logit gap ~1) without changing the argmax.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_target=1024,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.2,
        lm_head_scale=4.0,
    ),
    "small": dict(
        vocab_target=8192,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        initializer_range=0.1,
        lm_head_scale=2.5,
    ),
}
# The benchmark's long-prompt model (scoring a 4k-token prompt): `small` with a longer context.
SIZES["small-4k"] = {**SIZES["small"], "max_position_embeddings": 4096}
# The model `serve` builds on a first run: `tiny` (the same weights: RoPE positions cost no parameters) with a
# context that holds the tool lists Open WebUI and agent frameworks send (~13k tokens for Open WebUI's 36), and
# a generation_config.json max_new_tokens so a chat without max_tokens ends (a random model rarely says EOS).
SIZES["tiny-long"] = {**SIZES["tiny"], "max_position_embeddings": 32768, "max_new_tokens": 512}


def _default_cache_dir() -> Path:
    """Resolve the hub cache at call time so env vars set by tests win.

    ``huggingface_hub.constants.HF_HUB_CACHE`` is frozen at import time, so
    the environment is consulted first, in the same order the hub uses.
    """
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    import huggingface_hub.constants as hf_constants

    return Path(hf_constants.HF_HUB_CACHE).expanduser()


def _repo_folder(cache_dir: Path, repo_id: str) -> Path:
    """``org/name`` -> ``{cache}/models--org--name`` (the hub's naming)."""
    if not repo_id or repo_id.startswith("/") or repo_id.endswith("/"):
        raise ValueError(f"invalid repo id: {repo_id!r}")
    return cache_dir / ("models--" + repo_id.replace("/", "--"))


def train_tokenizer(vocab_size: int = 1024, model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the shipped corpus and wrap it for transformers.

    Returns a ``PreTrainedTokenizerFast`` that prepends BOS on
    ``add_special_tokens=True`` (like Llama) and carries the ChatML template.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(CORPUS_PATH)], trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in EXTRA_ADDED_TOKENS])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=model_max_length,
    )
    fast.chat_template = CHAT_TEMPLATE_PATH.read_text()
    return fast


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _default_file_mode(folder: Path) -> int:
    """Mode a plain new file gets in ``folder`` (umask applied), like hf_hub checks."""
    probe = folder / f".probe-{os.getpid()}-{uuid.uuid4().hex}"
    probe.touch()
    try:
        return probe.stat().st_mode & 0o777
    finally:
        probe.unlink()


def _install_into_cache(src_dir: Path, cache_dir: Path, repo_id: str) -> Path:
    """Move files from ``src_dir`` into the hub cache layout; return the snapshot.

    The commit hash is derived from the file names and contents, so rebuilding
    identical content yields the same snapshot. Older snapshots of the repo and
    blobs nobody references any more are removed, leaving exactly one revision.
    A lock under ``.locks/`` (where hf_hub keeps its own, ignored by
    ``scan_cache_dir``) serialises concurrent builds of the same repo.
    """
    from filelock import FileLock

    repo_dir = _repo_folder(cache_dir, repo_id)
    lock_path = cache_dir / ".locks" / repo_dir.name / "tiny-build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_path)):
        return _install_locked(src_dir, repo_dir)


def _install_locked(src_dir: Path, repo_dir: Path) -> Path:
    blobs, snapshots, refs = repo_dir / "blobs", repo_dir / "snapshots", repo_dir / "refs"
    for d in (blobs, snapshots, refs):
        d.mkdir(parents=True, exist_ok=True)

    files = sorted(p.relative_to(src_dir).as_posix() for p in src_dir.rglob("*") if p.is_file())
    hashes = {name: _sha256(src_dir / name) for name in files}
    commit = hashlib.sha1("".join(f"{n}\0{hashes[n]}\n" for n in files).encode()).hexdigest()

    mode = _default_file_mode(blobs)
    for name in files:
        blob = blobs / hashes[name]
        if not blob.exists():
            # Same `.incomplete` convention as hf_hub downloads, then atomic rename.
            tmp = blobs / f"{hashes[name]}.incomplete"
            shutil.move(str(src_dir / name), tmp)
            os.chmod(tmp, mode)  # safetensors is written as a 0600 temp file
            os.replace(tmp, blob)

    # Same content -> same commit: refresh links in place (atomic per file) so a
    # process reading the snapshot during a rebuild never sees it missing.
    snap = snapshots / commit
    if snap.exists():
        for stale in list(snap.rglob("*")):
            if not stale.is_dir() and stale.relative_to(snap).as_posix() not in hashes:
                stale.unlink()
    for name in files:
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp_link = link.with_name(f".{link.name}.{uuid.uuid4().hex}.tmp")
        os.symlink(os.path.relpath(blobs / hashes[name], link.parent), tmp_link)
        os.replace(tmp_link, link)

    tmp_ref = repo_dir / f".refs-main.{uuid.uuid4().hex}.tmp"  # outside refs/: scans read every file there
    tmp_ref.write_text(commit)  # no trailing newline: scan_cache_dir keys on the raw content
    os.replace(tmp_ref, refs / "main")

    for other in snapshots.iterdir():
        if other.name == commit:
            continue
        if other.is_dir() and not other.is_symlink():
            shutil.rmtree(other)
        else:
            other.unlink()
    keep = set(hashes.values())
    for blob in blobs.iterdir():
        if blob.name not in keep:
            blob.unlink()
    return snap


def _save_and_install(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast | ProcessorMixin, cache_dir: str | os.PathLike | None,
    repo_id: str,
) -> Path:
    """Serialise into a scratch dir first so a failed build never half-writes the cache (a processor saves its tokenizer)."""
    cache = _resolve_cache(cache_dir)
    with tempfile.TemporaryDirectory(prefix="tiny-model-") as tmp:
        out = Path(tmp)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        return _install_into_cache(out, cache, repo_id)


def _resolve_cache(cache_dir: str | os.PathLike | None) -> Path:
    path = Path(cache_dir).expanduser() if cache_dir is not None else _default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_tiny_model(
    repo_id: str,
    size: str = "tiny",
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    vocab_rows: int | None = None,
) -> Path:
    """Build a random Llama causal LM + tokenizer and store it as ``repo_id``.

    Deterministic for a given ``seed``/``size`` (same files, same commit hash). `vocab_rows`
    below the tokenizer's size builds a broken checkpoint: most prompts hold token ids the
    embedding lacks, so generation fails inside the forward pass (for fault tests).
    Returns the snapshot directory, e.g. ``.../models--org--name/snapshots/<sha>``.
    """
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {sorted(SIZES)}")
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    spec = dict(SIZES[size])
    lm_head_scale = spec.pop("lm_head_scale")
    max_new_tokens = spec.pop("max_new_tokens", None)
    tokenizer = train_tokenizer(spec.pop("vocab_target"), spec["max_position_embeddings"])
    bos, eos, pad = (tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD))
    config = LlamaConfig(
        vocab_size=vocab_rows or len(tokenizer),
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        **spec,
    )
    with torch.random.fork_rng(devices=[]):  # seed locally, leave the caller's RNG alone
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(lm_head_scale)
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
                                               **({"max_new_tokens": max_new_tokens} if max_new_tokens else {}))
    return _save_and_install(model, tokenizer, cache_dir, repo_id)


def build_tiny_alibi_model(repo_id: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Store a random Falcon with ALiBi position biases (as tiiuae/falcon-rw-1b), the tiny tokenizer and
    SDPA attention: a model that reads the 2D attention mask for more than which keys to attend (its
    biases are built from it), for the engine's check before it hands models their masks itself."""
    import torch
    from transformers import FalconConfig, FalconForCausalLM, GenerationConfig

    tokenizer = train_tokenizer(SIZES["tiny"]["vocab_target"], 512)
    bos, eos, pad = (tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD))
    config = FalconConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          alibi=True, new_decoder_architecture=False, multi_query=True, parallel_attn=True,
                          bias=False, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = FalconForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    return _save_and_install(model, tokenizer, cache_dir, repo_id)


def build_non_causal_model(repo_id: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Store a tiny BERT encoder (no LM head) so catalogs can test filtering."""
    import torch
    from transformers import BertConfig, BertModel

    tokenizer = train_tokenizer(SIZES["tiny"]["vocab_target"], 128)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BertModel(config).to(torch.float32).eval()
    return _save_and_install(model, tokenizer, cache_dir, repo_id)
