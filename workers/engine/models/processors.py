"""A media model's processor, loaded even where its video processor cannot be.

transformers' video processors run on torchvision, which does not run with this project's CPU torch
build, and without it transformers cannot build any processor that has one (Gemma 4, Qwen2-VL,
Qwen2.5-VL, Qwen2.5-Omni…): `AutoProcessor` raises, and the processor's class check cannot even name
the video processor's base class. So such a processor is built from its other parts as transformers would
load them, with a stand-in for the video processor: for the Qwen-VL family, one that does what theirs does to
the frames the server samples (workers/engine/models/video_frames.py); for the others, one that refuses
videos, which then go to the model as frames taken as images, and their sound track
(workers/engine/inputs/media_prompts.py).
"""
from __future__ import annotations

import logging
from typing import Any

from transformers.video_processing_utils import VideoProcessorMixin

from workers.engine.models.video_frames import QwenVideoFrames, qwen_video_frames

logger = logging.getLogger(__name__)

VIDEO_PROCESSOR = "video_processor"


def load_processor(repo_id: str, **kwargs) -> Any:
    """`AutoProcessor.from_pretrained(repo_id, backend="pil", **kwargs)`; without torchvision, a processor
    that takes a video processor is built without one (the rest loaded as transformers loads them)."""
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    try:
        return AutoProcessor.from_pretrained(repo_id, backend="pil", **kwargs)
    except (ImportError, ValueError, TypeError, AttributeError):
        processor_class = None if is_torchvision_available() else _processor_class(repo_id, **kwargs)
        if processor_class is None or VIDEO_PROCESSOR not in processor_class.get_attributes():
            raise
    processor = _from_parts(processor_class, repo_id, **kwargs)
    if isinstance(processor.video_processor, QwenVideoFrames):
        logger.info("%s: its processor %s loaded with a stand-in for its video processor %s (that needs "
                    "torchvision), over the frames the server samples", repo_id, processor_class.__name__,
                    processor.video_processor.processor_type)
    else:
        logger.info("%s: its processor %s loaded without its video processor (that needs torchvision); "
                    "a video goes to the model as frames and sound", repo_id, processor_class.__name__)
    return processor


def takes_videos(processor) -> bool:
    """Whether the processor turns a video's frames into the model's video inputs (its own video processor,
    or the Qwen-VL stand-in), rather than the frames going in as images."""
    video_processor = getattr(processor, VIDEO_PROCESSOR, None)
    return video_processor is not None and not isinstance(video_processor, NoVideoProcessor)


def _processor_class(repo_id: str, **kwargs) -> type | None:
    """The processor class transformers would pick for the repo (its config's model type), if it has one."""
    from transformers import AutoConfig
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    config = AutoConfig.from_pretrained(repo_id, **kwargs)
    return PROCESSOR_MAPPING.get(type(config), None)


def _from_parts(processor_class: type, repo_id: str, **kwargs) -> Any:
    from transformers import AutoFeatureExtractor, AutoImageProcessor, AutoTokenizer

    loaders = {"tokenizer": AutoTokenizer.from_pretrained, "feature_extractor": AutoFeatureExtractor.from_pretrained,
               "image_processor": lambda *a, **k: AutoImageProcessor.from_pretrained(*a, backend="pil", **k)}
    standing_in = without_video(processor_class)
    processor_dict, rest = standing_in.get_processor_dict(repo_id, **kwargs)
    saved_video = processor_dict.pop(VIDEO_PROCESSOR, None)
    parts = []
    for attribute in processor_class.get_attributes():
        if attribute == VIDEO_PROCESSOR:
            stand_in = qwen_video_frames(processor_class, repo_id, saved_video, **_file_options(kwargs))
            parts.append(stand_in or NoVideoProcessor())
        elif attribute in loaders:
            parts.append(loaders[attribute](repo_id, **kwargs))
        else:
            raise ValueError(f"{processor_class.__name__}'s {attribute} cannot be loaded without its video processor")
    return standing_in.from_args_and_dict(parts, processor_dict, **rest)


def _file_options(kwargs: dict) -> dict:
    return {key: kwargs[key] for key in ("cache_dir", "local_files_only", "revision", "token") if key in kwargs}


def without_video(processor_class: type) -> type:
    """The processor class, its video processor allowed to be a stand-in (transformers checks each
    part's class by name, and without torchvision it cannot look up the video processors' base class)."""
    def check_argument_for_proper_class(self, argument_name: str, argument: Any):
        if argument_name == VIDEO_PROCESSOR and isinstance(argument, (NoVideoProcessor, QwenVideoFrames)):
            return VideoProcessorMixin
        return processor_class.check_argument_for_proper_class(self, argument_name, argument)

    return type(processor_class.__name__, (processor_class,), {
        "check_argument_for_proper_class": check_argument_for_proper_class, "__module__": processor_class.__module__})


class NoVideoProcessor(VideoProcessorMixin):
    """Stands in for a video processor that needs torchvision: refuses videos, saves as nothing."""

    def __call__(self, *args, **kwargs):
        raise ValueError("videos need torchvision here; this server sends a video as its frames and sound")

    def to_dict(self) -> dict:
        return {}
