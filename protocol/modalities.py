"""What a model takes as input and which job it serves, read from its config.json alone.

Plain Python (no torch): the catalog lists models and `/v1/models` reports their modalities
from the same answer the worker uses to pick the model class and refuse what it cannot take.
"""
from __future__ import annotations

from typing import Literal

Kind = Literal["causal", "image_text", "audio_text", "omni", "speech", "embedding", "cross_encoder"]
TEXT, IMAGE, AUDIO, VIDEO = "text", "image", "audio", "video"
CAUSAL_ARCHITECTURE_SUFFIXES = ("ForCausalLM", "LMHeadModel")
# transformers' causal-LM classes named otherwise (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES; tests/test_type_matrix.py
# checks the list against the installed transformers)
OTHER_CAUSAL_ARCHITECTURES = frozenset({"BertGenerationDecoder", "ReformerModelWithLMHead"})
CROSS_ENCODER_SUFFIX = "ForSequenceClassification"


def model_kind(config: dict, sentence_transformers: bool = False) -> Kind | None:
    """`causal` (text generation), `image_text` (a vision-language model whose processor takes images),
    `audio_text` (an audio-language chat model such as Qwen2-Audio: an audio encoder beside a text model),
    `omni` (vision and audio encoders beside a text model: Gemma 3n/4, Qwen2.5-Omni's thinker),
    `speech` (a speech-to-text encoder-decoder such as Whisper), `embedding` (a sentence-transformers repo:
    its `modules.json` says how to pool, encoder or causal LM alike), `cross_encoder` (a sequence-classification
    model: one score per text pair, as sentence-transformers' CrossEncoder), or None (nothing this server serves)."""
    if sentence_transformers:
        return "embedding"
    if config.get("is_encoder_decoder") and "num_mel_bins" in config:
        return "speech"
    parts = config.get("thinker_config") if isinstance(config.get("thinker_config"), dict) else config  # Qwen2.5-Omni's
    vision, audio = isinstance(parts.get("vision_config"), dict), isinstance(parts.get("audio_config"), dict)
    if isinstance(parts.get("text_config"), dict) and vision and audio:
        return "omni"
    if vision and isinstance(parts.get("text_config"), dict):
        return "image_text"
    if audio and isinstance(parts.get("text_config"), dict):
        return "audio_text"
    architectures = [a for a in config.get("architectures") or () if isinstance(a, str)]
    if any(arch.endswith(CROSS_ENCODER_SUFFIX) for arch in architectures):
        return "cross_encoder"
    if any(arch.endswith(CAUSAL_ARCHITECTURE_SUFFIXES) or arch in OTHER_CAUSAL_ARCHITECTURES for arch in architectures):
        return "causal"
    return None


def input_modalities(kind: Kind | None) -> tuple[str, ...]:
    """A vision-language model takes video as frames sampled into images (see workers.media.decoding)."""
    return {"causal": (TEXT,), "image_text": (TEXT, IMAGE, VIDEO), "audio_text": (TEXT, AUDIO),
            "omni": (TEXT, IMAGE, VIDEO, AUDIO),
            "speech": (AUDIO,), "embedding": (TEXT,), "cross_encoder": (TEXT,)}.get(kind, ())


def model_tasks(kind: Kind | None) -> tuple[str, ...]:
    """What a model is asked for: `generate` (text out), `transcribe` (audio to text), `embed` (vectors) or
    `score` (a number per text pair: /v1/score and /v1/rerank; embedding models score by cosine similarity)."""
    if kind is None:
        return ()
    return {"speech": ("transcribe",), "embedding": ("embed", "score"),
            "cross_encoder": ("score",)}.get(kind, ("generate",))
