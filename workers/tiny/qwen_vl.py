"""Offline builders for tiny Qwen-VL models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): M-RoPE vision-language models.

Their text model rotates each token by three positions (time, height, width): an image's tokens take
positions from its grid, and the text after it continues from the largest one, so every later token sits
at `index + delta` with a per-prompt delta (`get_rope_index`). The shapes are the real architectures',
small: a vision tower of 4-pixel patches merged 2x2 (a 32x32 picture is 16 image tokens), the
`<|vision_start|><|image_pad|><|vision_end|>` and `<|video_pad|>` placeholders Qwen's chat template writes,
the PIL image processor (transformers' torchvision-backed processors cannot run with this project's torch
build), each generation's own processor and video processor named in its config (Qwen3-VL's writes each
frame pair's time), and an `mrope_section` cut for the tiny heads. Random weights with a fixed seed, no network.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from workers.tiny.builders import SIZES, _install_into_cache, _resolve_cache, train_tokenizer

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
QWEN_VL_KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
PATCH, MERGE, IMAGE_SIZE = 4, 2, 32


def _qwen_chat_template(template: str) -> str:
    """The tiny ChatML template with image and video parts written as Qwen's own template writes them."""
    image_branch = "{%- elif part.type == 'image' -%}"
    assert image_branch in template and "{{- '<image>' -}}" in template
    return template.replace("{{- '<image>' -}}", f"{{{{- '{VISION_START}{IMAGE_PAD}{VISION_END}' -}}}}").replace(
        image_branch, f"{{%- elif part.type == 'video' -%}}\n                {{{{- '{VISION_START}{VIDEO_PAD}"
                      f"{VISION_END}' -}}}}\n            {image_branch}")


def _configs(kind: str, text: dict, vision_out: int, token_ids: dict):
    """(config, model class) for one Qwen-VL generation, its text part from the tiny size's fields."""
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    half = head_dim // 2
    section = [half - 2 * (half // 3), half // 3, half // 3]  # time, height, width: their rotary pairs
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
    if kind == "qwen2_vl":
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

        vision = dict(depth=2, embed_dim=32, hidden_size=vision_out, num_heads=2, patch_size=PATCH,
                      spatial_merge_size=MERGE, temporal_patch_size=2, mlp_ratio=2)
        return Qwen2VLConfig(text_config={**text, "rope_parameters": rope}, vision_config=vision,
                             **token_ids), Qwen2VLForConditionalGeneration
    if kind == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        vision = dict(depth=2, hidden_size=32, intermediate_size=64, out_hidden_size=vision_out, num_heads=2,
                      patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2, window_size=16,
                      fullatt_block_indexes=[1])
        return Qwen2_5_VLConfig(text_config={**text, "rope_parameters": rope}, vision_config=vision,
                                **token_ids), Qwen2_5_VLForConditionalGeneration
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    rope["mrope_interleaved"] = True
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, out_hidden_size=vision_out, num_heads=2,
                  patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2, num_position_embeddings=64,
                  deepstack_visual_indexes=[0])
    return Qwen3VLConfig(text_config={**text, "head_dim": head_dim, "rope_parameters": rope}, vision_config=vision,
                         **token_ids), Qwen3VLForConditionalGeneration


def build_tiny_qwen_vl(repo_id: str, kind: str = "qwen2_vl", cache_dir: str | os.PathLike | None = None,
                       seed: int = 0) -> Path:
    """A tiny `kind` (one of QWEN_VL_KINDS) with its processor, into the cache as `repo_id`."""
    import torch
    from transformers import GenerationConfig, Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from workers.engine.models.processors import NoVideoProcessor, without_video

    if kind not in QWEN_VL_KINDS:
        raise ValueError(f"kind must be one of {QWEN_VL_KINDS}")
    spec = dict(SIZES["tiny"])
    lm_head_scale = spec.pop("lm_head_scale")
    tokenizer = train_tokenizer(spec.pop("vocab_target"), spec["max_position_embeddings"])
    tokenizer.add_special_tokens({"additional_special_tokens": [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]})
    tokenizer.chat_template = _qwen_chat_template(tokenizer.chat_template)
    image_processor = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2,
                                               min_pixels=IMAGE_SIZE * IMAGE_SIZE, max_pixels=IMAGE_SIZE * IMAGE_SIZE)
    processor_class = {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor,
                       "qwen3_vl": Qwen3VLProcessor}[kind]
    processor = without_video(processor_class)(image_processor=image_processor, tokenizer=tokenizer,
                                               video_processor=NoVideoProcessor(),
                                               chat_template=tokenizer.chat_template)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    token_ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", IMAGE_PAD), ("video_token_id", VIDEO_PAD), ("vision_start_token_id", VISION_START),
        ("vision_end_token_id", VISION_END))}
    text = dict(vocab_size=len(tokenizer), rms_norm_eps=1e-5, **ids, **spec)
    config, model_class = _configs(kind, text, spec["hidden_size"], token_ids)
    config.tie_word_embeddings = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(torch.float32).eval()
        with torch.no_grad():  # as the text model: a larger init so the picture changes the answer
            for parameter in model.model.visual.parameters():
                if parameter.dim() > 1:
                    parameter.normal_(0.0, 0.2)
            model.lm_head.weight.mul_(lm_head_scale)
    model.generation_config = GenerationConfig(**ids)
    with tempfile.TemporaryDirectory(prefix="tiny-model-") as tmp:
        out = Path(tmp)
        model.save_pretrained(out, safe_serialization=True)
        processor.save_pretrained(out)
        _name_qwens_video_processor(out, kind, image_processor)
        return _install_into_cache(out, _resolve_cache(cache_dir), repo_id)


def _name_qwens_video_processor(folder: Path, kind: str, image_processor) -> None:
    """The saved processor as a hub Qwen-VL's reads: its video processor its generation's own (which needs
    torchvision; without it the server stands in for it: workers/engine/models/video_frames.py), sized as the
    pictures are (Qwen3-VL's bound counts every frame of a video)."""
    path = folder / "processor_config.json"
    saved = json.loads(path.read_text())
    frames_counted = 4 if kind == "qwen3_vl" else 1
    saved["video_processor"] = {
        "video_processor_type": "Qwen3VLVideoProcessor" if kind == "qwen3_vl" else "Qwen2VLVideoProcessor",
        "patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": 2,
        "size": {"shortest_edge": IMAGE_SIZE * IMAGE_SIZE, "longest_edge": frames_counted * IMAGE_SIZE * IMAGE_SIZE},
        "image_mean": list(image_processor.image_mean), "image_std": list(image_processor.image_std)}
    path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
