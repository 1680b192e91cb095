"""Offline builder for a tiny omni model: a Gemma 4 (vision and audio encoders beside the text model).

Gemma 4 is the omni family transformers runs best as a causal LM here: its vision tower is its own ViT
(Gemma 3n's is a timm MobileNet, and timm needs torchvision), its text model takes plain 1-D positions
(Qwen2.5-Omni's thinker takes 3-D M-RoPE positions with per-request offsets, which the engine's batched
decode does not give), and its image processor and audio feature extractor run on PIL and numpy. Its
video processor needs torchvision, which does not run with this project's torch build: the processor is
built here without one, and its `processor_config.json` names Gemma 4's as a hub repo's does, so the
server loads it the way it loads a hub Gemma 4 (workers/engine/models/processors.py).

The shapes are the real architecture's, small: sliding and full layers, per-layer embeddings (PLE),
bidirectional attention over each image's tokens, 3x3 pooling of 4-pixel patches (at most 70 image
tokens, Gemma 4's smallest budget), a 16-bin conformer audio encoder (one token per 40 ms).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from workers.tiny.builders import _install_into_cache, _resolve_cache, train_tokenizer

OMNI_TOKENS = dict(image_token="<|image|>", boi_token="<|boi|>", eoi_token="<|eoi|>", audio_token="<|audio|>",
                   boa_token="<|boa|>", eoa_token="<|eoa|>")
OMNI_PATCH_SIZE, OMNI_POOLING, OMNI_SOFT_TOKENS = 4, 3, 70
OMNI_MEL_BINS = 16  # the audio encoder's first convolution's channels: Gemma 4 reads one per mel bin
OMNI_CONTEXT = 4096  # 8 video frames of 64 image tokens each, their sound and the text fit


def omni_chat_template(template: str) -> str:
    """The tiny ChatML template with Gemma 4's placeholders: `<|image|>` per image and `<|audio|>` per clip,
    each expanded by the processor (`<|boi|>` + one token per soft token + `<|eoi|>`, the same for audio)."""
    image_branch = "{%- elif part.type == 'image' -%}"
    assert image_branch in template and "{{- '<image>' -}}" in template
    return template.replace("{{- '<image>' -}}", f"{{{{- '{OMNI_TOKENS['image_token']}' -}}}}").replace(
        image_branch, f"{{%- elif part.type == 'audio' -%}}\n                {{{{- '{OMNI_TOKENS['audio_token']}' -}}}}\n"
                      f"            {image_branch}")


def build_tiny_omni(repo_id: str, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """A Gemma4ForConditionalGeneration with its Gemma4Processor (PIL image processor, Gemma 4's audio
    feature extractor, the project's trained tokenizer with Gemma 4's named media tokens)."""
    import torch
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4ForConditionalGeneration, Gemma4Processor
    from transformers import Gemma4TextConfig, Gemma4VisionConfig, GenerationConfig
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    from workers.engine.models.processors import NoVideoProcessor, without_video

    tokenizer = train_tokenizer(1024, OMNI_CONTEXT)
    tokenizer.add_special_tokens({"additional_special_tokens": list(OMNI_TOKENS.values())})
    tokenizer._set_model_specific_special_tokens(OMNI_TOKENS)  # tokenizer.image_token etc., as Gemma 4's
    tokenizer.chat_template = omni_chat_template(tokenizer.chat_template)
    processor = without_video(Gemma4Processor)(
        feature_extractor=Gemma4AudioFeatureExtractor(feature_size=OMNI_MEL_BINS),
        image_processor=Gemma4ImageProcessorPil(patch_size=OMNI_PATCH_SIZE, max_soft_tokens=OMNI_SOFT_TOKENS,
                                                pooling_kernel_size=OMNI_POOLING),
        tokenizer=tokenizer, video_processor=NoVideoProcessor(), chat_template=tokenizer.chat_template,
        image_seq_length=OMNI_SOFT_TOKENS)  # the processor adds Gemma 4's <|video|> token to the vocabulary
    token = tokenizer.convert_tokens_to_ids
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    text_config = Gemma4TextConfig(
        vocab_size=len(tokenizer), vocab_size_per_layer_input=len(tokenizer), hidden_size=64, intermediate_size=192,
        num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=16,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=16, hidden_size_per_layer_input=8,
        max_position_embeddings=OMNI_CONTEXT, use_bidirectional_attention="vision", final_logit_softcapping=30.0,
        tie_word_embeddings=False, initializer_range=0.2, **ids)
    vision_config = Gemma4VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        head_dim=16, patch_size=OMNI_PATCH_SIZE, pooling_kernel_size=OMNI_POOLING, position_embedding_size=64,
        initializer_range=0.2)
    audio_config = Gemma4AudioConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     subsampling_conv_channels=[OMNI_MEL_BINS, 4], output_proj_dims=32,
                                     initializer_range=0.2)
    config = Gemma4Config(
        text_config=text_config, vision_config=vision_config, audio_config=audio_config, initializer_range=0.2,
        tie_word_embeddings=False, image_token_id=token(OMNI_TOKENS["image_token"]),
        boi_token_id=token(OMNI_TOKENS["boi_token"]), eoi_token_id=token(OMNI_TOKENS["eoi_token"]),
        audio_token_id=token(OMNI_TOKENS["audio_token"]), boa_token_id=token(OMNI_TOKENS["boa_token"]),
        eoa_token_index=token(OMNI_TOKENS["eoa_token"]), video_token_id=token(processor.video_token))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Gemma4ForConditionalGeneration(config).to(torch.float32).eval()
        with torch.no_grad():  # every patch position its own embedding (the init makes them all ones)
            model.model.vision_tower.patch_embedder.position_embedding_table.normal_(0.0, 0.2)
    model.generation_config = GenerationConfig(**ids)
    cache = _resolve_cache(cache_dir)
    with tempfile.TemporaryDirectory(prefix="tiny-model-") as tmp:
        out = Path(tmp)
        model.save_pretrained(out, safe_serialization=True)
        processor.save_pretrained(out)
        _name_gemma4s_video_processor(out)
        return _install_into_cache(out, cache, repo_id)


def _name_gemma4s_video_processor(folder: Path) -> None:
    """The saved processor as a hub Gemma 4's reads: its video processor Gemma 4's own (which needs torchvision)."""
    path = folder / "processor_config.json"
    saved = json.loads(path.read_text())
    saved["video_processor"] = {"video_processor_type": "Gemma4VideoProcessor", "patch_size": OMNI_PATCH_SIZE,
                                "max_soft_tokens": OMNI_SOFT_TOKENS, "pooling_kernel_size": OMNI_POOLING}
    path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
