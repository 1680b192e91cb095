"""Conversations with images, video or audio: read off the engine thread, rendered by the model's processor.

A media part in a job's conversation (see `protocol.MediaPart`) carries a URL. Before
the job reaches the engine, `read_job_media` turns each URL into bytes (data: URLs decoded,
http(s) fetched within limits) on a thread of its own, so a slow server never stalls decoding.
On the engine, `render_media_conversation` checks each part against the model's modalities,
decodes it (a video into frames: a video for a processor that takes one, else frames taken as images),
renders the chat template with one placeholder part per image or video, and runs the model's `AutoProcessor` exactly as
`processor.apply_chat_template(..., tokenize=True)` would: its input ids (image tokens
expanded) and the tensors the model's forward takes with them.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from workers.engine.inputs.chat_templates import RenderedPrompt, render_conversation
from workers.engine.config import TemplateSettings
from workers.media.limits import MediaSettings
from workers.engine.errors import JobError
from workers.engine.models.processors import takes_videos
from workers.media.decoding import MediaError, decode_audio, decode_image, decode_video_clip, read_url
from protocol.modalities import AUDIO, IMAGE, VIDEO

MEDIA_TYPES = (IMAGE, VIDEO, AUDIO)
MIN_AUDIO_SECONDS = 0.1  # OpenAI's minimum; shorter clips give audio encoders (Qwen2-Audio's) one feature or none


def media_parts(prompt: Any) -> Iterator[tuple[str, dict]]:
    """(error path, part) for every media part of a conversation prompt, in order."""
    if not isinstance(prompt, dict):
        return
    for m, message in enumerate(prompt.get("messages") or ()):
        content = message.get("content")
        if isinstance(content, list):
            for p, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") in MEDIA_TYPES:
                    yield f"messages[{m}].content[{p}]", part


def has_media(prompt: Any) -> bool:
    return next(media_parts(prompt), None) is not None


def job_has_media(job: dict) -> bool:
    return any(has_media(prompt) for prompt in job.get("prompts") or ())


def read_job_media(job: dict, limits: MediaSettings) -> None:
    """In place: every media part's `url` read into `data` bytes (a video's also told how many frames
    to become). Blocking (fetches): run it on a thread."""
    for prompt in job["prompts"]:
        for path, part in media_parts(prompt):
            if "data" not in part:
                part["data"] = read_url(part.pop("url"), path, limits)[1]
            if part["type"] == VIDEO:
                part.setdefault("frames", limits.video_frames)


def _check_modalities(loaded, prompt: dict) -> None:
    for path, part in media_parts(prompt):
        if part["type"] not in loaded.modalities:
            raise JobError(400, f"The model `{loaded.model_id}` does not take {part['type']} input "
                           f"(it takes: {', '.join(loaded.modalities)}).", path, "unsupported_modality")


def _decoded(loaded, prompt: dict) -> tuple[list[dict], dict[str, list]]:
    """The messages with placeholder parts for the template, and the decoded media in order, by kind."""
    processor = loaded.processor
    media: dict[str, list] = {IMAGE: [], VIDEO: [], AUDIO: []}
    messages = []
    for m, message in enumerate(prompt["messages"]):
        content = message.get("content")
        if not isinstance(content, list):
            messages.append(message)
            continue
        parts = []
        for p, part in enumerate(content):
            kind, path = part.get("type"), f"messages[{m}].content[{p}]"
            if kind == IMAGE:
                media[IMAGE].append(decode_image(part["data"], path))
                parts.append({"type": IMAGE})
            elif kind == VIDEO:
                clip = decode_video_clip(part["data"], path, part.get("frames", MediaSettings.video_frames))
                if takes_videos(processor):
                    media[VIDEO].append(clip)
                    parts.append({"type": VIDEO})
                else:  # frames as images, in order (a video processor that needs torchvision is not there)
                    media[IMAGE].extend(clip.frames)
                    parts.extend({"type": IMAGE} for _ in clip.frames)
                track = _audio_track(loaded, part["data"], path)
                if track is not None:  # a model that hears (Gemma 3n/4, Qwen2.5-Omni) gets the video's sound too
                    media[AUDIO].append(track)
                    parts.append({"type": AUDIO})
            elif kind == AUDIO:
                rate = processor.feature_extractor.sampling_rate
                samples = decode_audio(part["data"], path, rate, part.get("format"))
                if len(samples) < MIN_AUDIO_SECONDS * rate:
                    raise MediaError(f"{path}: the audio is shorter than the minimum of {MIN_AUDIO_SECONDS:g} s.",
                                     path, "audio_too_short")
                media[AUDIO].append(samples)
                parts.append({"type": AUDIO})
            else:
                parts.append(part)
        messages.append({**message, "content": parts})
    return messages, media


def _audio_track(loaded, data: bytes, path: str):
    """A video's sound for a model that takes audio as well (None: it takes none, or the video is silent)."""
    if AUDIO not in loaded.modalities:
        return None
    rate = loaded.processor.feature_extractor.sampling_rate
    try:
        samples = decode_audio(data, path, rate)
    except MediaError:  # no audio stream (or none decodable): the frames alone
        return None
    return samples if len(samples) >= MIN_AUDIO_SECONDS * rate else None


def render_media_conversation(loaded, prompt: dict, templates: TemplateSettings) -> RenderedPrompt:
    """Ids and processor tensors for a conversation with media; unusable media is a JobError 400/413."""
    _check_modalities(loaded, prompt)
    processor = loaded.processor
    try:
        messages, media = _decoded(loaded, prompt)
    except MediaError as exc:
        raise JobError(exc.status, exc.message, exc.param, exc.code) from None
    rendered = render_conversation(loaded.tokenizer, {**prompt, "messages": messages}, templates,
                                   default_template=getattr(processor, "chat_template", None))
    bos = loaded.tokenizer.bos_token
    kwargs: dict[str, Any] = {"add_special_tokens": not (bos and rendered.text.startswith(bos))}
    if media[IMAGE]:
        kwargs["images"] = media[IMAGE]
    if media[VIDEO]:  # the frames the server sampled, taken as they are, and which they are (for timestamps)
        kwargs.update(videos=[clip.frames for clip in media[VIDEO]], do_sample_frames=False,
                      video_metadata=[video_metadata(clip) for clip in media[VIDEO]])
    if media[AUDIO]:
        kwargs.update(audio=media[AUDIO], sampling_rate=processor.feature_extractor.sampling_rate)
    try:
        inputs = processor(text=[rendered.text], return_tensors="pt", **kwargs)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise JobError(400, f"The model's processor could not take this input: {exc}", "messages",
                       "invalid_media") from None
    extra = {key: value for key, value in inputs.items()
             if key not in ("input_ids", "attention_mask") and isinstance(value, torch.Tensor)}
    return RenderedPrompt(inputs["input_ids"][0].tolist(), rendered.text, extra)


def video_metadata(clip):
    """What transformers' video processors are told of frames sampled before them."""
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(total_num_frames=clip.total_frames, fps=clip.fps, frames_indices=clip.indices,
                         width=clip.frames[0].width, height=clip.frames[0].height)
