"""Qwen-VL videos without torchvision: the Qwen2-VL and Qwen3-VL video processors' arithmetic over frames.

transformers' video processors run on torchvision, which does not run beside this project's CPU torch
build. For the Qwen-VL family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) a video is not frames-as-images: its frames
are paired in time (`temporal_patch_size`), take one grid (`video_grid_thw`) and M-RoPE positions of their
own, and Qwen2.5-VL and Qwen3-VL read the video's time (`second_per_grid_ts`, the prompt's `<t seconds>`).
`QwenVideoFrames` does what `Qwen2VLVideoProcessor` / `Qwen3VLVideoProcessor` do to frames the server has
already sampled (workers/media/decoding.py): resize each frame to the size their `smart_resize` picks (PIL's
bicubic, where torchvision's bicubic differs in the last bits), rescale, normalize, repeat the last frame to
a whole temporal patch, and lay the patches out as they do; with the video's metadata (its fps and which
frames were taken) for the processor's timestamps. Where torchvision is installed, transformers' own run.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import BatchFeature
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from transformers.video_processing_utils import VideoProcessorMixin
from transformers.video_utils import VideoMetadata

# The video processors this stands in for, and whether their resize weighs the number of frames (Qwen3-VL's).
STANDS_IN_FOR = {"Qwen2VLVideoProcessor": False, "Qwen3VLVideoProcessor": True}
# The processors it serves (checked against `generate` in tests/test_mrope.py); Qwen2.5-Omni's, which pairs a
# video with its sound, is not among them: its videos still go as frames and sound.
PROCESSORS = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor")
DEFAULTS = {  # each class's own defaults, for a config that leaves a field out
    "Qwen2VLVideoProcessor": dict(patch_size=14, size={"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768},
                                  image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD),
    "Qwen3VLVideoProcessor": dict(patch_size=16, size={"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
                                  image_mean=IMAGENET_STANDARD_MEAN, image_std=IMAGENET_STANDARD_STD),
}


class QwenVideoFrames(VideoProcessorMixin):
    """Stands in for a Qwen-VL video processor: frames in, `pixel_values_videos` and `video_grid_thw` out."""

    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, processor_type: str, config: dict[str, Any]) -> None:
        settings = {**DEFAULTS[processor_type], **config}
        self.processor_type = processor_type
        self.weighs_frames = STANDS_IN_FOR[processor_type]
        self.patch_size = int(settings["patch_size"])
        self.temporal_patch_size = int(settings.get("temporal_patch_size", 2))
        self.merge_size = int(settings.get("merge_size", 2))
        size = settings.get("size") or {}
        self.min_pixels = int(settings.get("min_pixels") or size.get("shortest_edge"))
        self.max_pixels = int(settings.get("max_pixels") or size.get("longest_edge"))
        self.rescale_factor = float(settings.get("rescale_factor", 1 / 255))
        self.image_mean = torch.tensor(settings["image_mean"], dtype=torch.float32)[:, None, None]
        self.image_std = torch.tensor(settings["image_std"], dtype=torch.float32)[:, None, None]

    def __call__(self, videos, video_metadata: list[VideoMetadata] | None = None, return_metadata: bool = False,
                 return_tensors: str | None = None, **_: Any) -> BatchFeature:
        patches, grids = [], []
        for frames in videos:
            video = self._resized(frames)
            flat, grid = self._patches(video)
            patches.append(flat)
            grids.append(grid)
        data: dict[str, Any] = {"pixel_values_videos": torch.cat(patches), "video_grid_thw": torch.tensor(grids)}
        if return_metadata:
            data["video_metadata"] = video_metadata or [VideoMetadata(total_num_frames=len(frames))
                                                        for frames in videos]
        return BatchFeature(data)

    def _resized(self, frames) -> torch.Tensor:
        """(frames, 3, height, width): each frame resized to the processor's size, rescaled and normalized."""
        from PIL import Image

        images = [Image.fromarray(np.asarray(frame, dtype=np.uint8)) for frame in frames]
        width, height = images[0].size
        new_height, new_width = self._size(len(images), height, width)
        pixels = np.stack([np.asarray(image.convert("RGB").resize((new_width, new_height), Image.BICUBIC))
                           for image in images])
        video = torch.from_numpy(pixels).permute(0, 3, 1, 2).to(torch.float32) * self.rescale_factor
        return (video - self.image_mean) / self.image_std

    def _size(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """Both processors' `smart_resize`: sides divisible by patch x merge, the pixels (Qwen3-VL: of every frame
        rounded to whole temporal patches) between the bounds, the aspect kept."""
        factor = self.patch_size * self.merge_size
        weight = 1
        if self.weighs_frames and frames < self.temporal_patch_size:
            raise ValueError(f"a video needs at least {self.temporal_patch_size} frames, got {frames}")
        if self.weighs_frames:
            if height < factor or width < factor:
                scale = max(factor / height, factor / width)
                height, width = int(height * scale), int(width * scale)
            weight = round(frames / self.temporal_patch_size) * self.temporal_patch_size
        ratio = max(height, width) / min(height, width)
        if ratio > 200:
            raise ValueError(f"absolute aspect ratio must be smaller than 200, got {ratio}")
        h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
        pixels = frames * height * width if self.weighs_frames else height * width
        if weight * h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(pixels / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif weight * h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / pixels)
            h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def _patches(self, video: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """The processors' patch layout: (grid_t * grid_h * grid_w, channels * temporal * patch * patch)."""
        if pad := -video.shape[0] % self.temporal_patch_size:
            video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
        frames, channels, height, width = video.shape
        temporal, patch, merge = self.temporal_patch_size, self.patch_size, self.merge_size
        grid_t, grid_h, grid_w = frames // temporal, height // patch, width // patch
        patches = video.view(grid_t, temporal, channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
        patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return patches.reshape(grid_t * grid_h * grid_w, channels * temporal * patch * patch), [grid_t, grid_h, grid_w]

    def to_dict(self) -> dict:
        return {}

    def to_json_string(self) -> str:
        return json.dumps({"video_processor_type": self.processor_type})


def qwen_video_frames(processor_class: type, repo_id: str, saved: dict | None,
                      **kwargs) -> QwenVideoFrames | None:
    """The stand-in for the repo's video processor, where the processor is a Qwen-VL one (its video processor's
    config: its own file, or the processor config's `video_processor` section, or the image processor's, as
    older repos have)."""
    from transformers.utils import cached_file

    if processor_class.__name__ not in PROCESSORS:
        return None
    config = dict(saved or {})
    if not config:
        for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
            path = cached_file(repo_id, name, _raise_exceptions_for_missing_entries=False, **kwargs)
            if path:
                config = json.loads(Path(path).read_text())
                break
    processor_type = config.get("video_processor_type") or _video_type_of_image_processor(config)
    return QwenVideoFrames(processor_type, config) if processor_type in STANDS_IN_FOR else None


def _video_type_of_image_processor(config: dict) -> str | None:
    """Older Qwen2-VL repos ship only the image processor's config; their video processor is Qwen2-VL's."""
    image_type = (config.get("image_processor_type") or "").removesuffix("Fast").removesuffix("Pil")
    return {"Qwen2VLImageProcessor": "Qwen2VLVideoProcessor"}.get(image_type)
